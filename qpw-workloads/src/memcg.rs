//! The memcg charge stock (`mm/memcontrol.c`): per-CPU caches of pre-charged pages in front of
//! hierarchical page counters, and the drain that returns them.
//!
//! # What the kernel does
//!
//! Charging a page to a memory cgroup means adding to a `page_counter` at every level from the
//! memcg up to the root, each checked against its limit: a walk of atomics shared by every CPU.
//! To avoid it, `try_charge_memcg()` charges `MEMCG_CHARGE_BATCH` (64) pages at once and keeps
//! the surplus in the CPU's `memcg_stock`; the next charges on that CPU come out of the stock
//! (`consume_stock()`, under `local_trylock(&memcg_stock.lock)`). Since 2025 the stock caches
//! `NR_MEMCG_STOCK` (7) memcgs per CPU, each slot a `{cached, nr_pages}` pair:
//!
//! - `consume_stock(memcg, nr)`: fails when the trylock fails, when `nr` exceeds the batch, or
//!   when no slot caches `memcg` with enough pages;
//! - `refill_stock(memcg, nr)`: adds to `memcg`'s slot and drains it (`drain_stock()`: uncharge
//!   the pages) once it holds more than a batch; takes an empty slot, or evicts one when all 7 are
//!   used; a refill larger than a batch, or a failed trylock, uncharges directly;
//! - `try_charge_memcg(memcg, nr)`: stock first; else charge `max(64, nr)` to the counters and
//!   refill the surplus; on failure retry with exactly `nr`, then `drain_all_stock()` the memcg
//!   over its limit and retry once more, then fail (`-ENOMEM`; reclaim is left out here);
//! - `drain_all_stock(root)`: returns at once when another drain holds `percpu_charge_mutex`
//!   (`mutex_trylock`); otherwise, for every CPU whose `FLUSHING_CACHED_CHARGE` bit is clear and
//!   whose stock caches a descendant of `root` (a racy peek), sets the bit
//!   (`test_and_set_bit`) and drains the stock: the caller's own CPU directly
//!   (`drain_local_memcg_stock()`), the others by `schedule_work_on(cpu, &stock->work)`, except,
//!   in mainline since 2023, CPUs that `cpu_is_isolated()`: those are left alone and their pages
//!   stay charged. It does **not** wait for the work it schedules: the work drains the stock
//!   and clears the bit whenever the CPU's kworker gets to run.
//!
//! # The FLUSHING bit
//!
//! The bit says "a drain of this CPU is on its way": a drain that finds it set skips the CPU,
//! trusting the work already scheduled. Only the drain work (`drain_local_memcg_stock()`, run
//! on the CPU) clears it. Mainline sets the bit *before* it looks at isolation, so on an
//! isolated CPU the bit is set, no work is scheduled, and the bit stays set: every later
//! `drain_all_stock` skips that CPU, even one the isolated CPU runs itself (the bit is tested
//! before the "own CPU" case), until the CPU runs `drain_local_memcg_stock()` itself. This
//! model reproduces that stale bit ([`StockDrainStrategy::SkipIsolated`],
//! [`Memcg::flushing_cpus`]); [`Memcg::drain_local_stock`] is the CPU running the drain work
//! itself, which nothing in mainline does for an isolated CPU.
//!
//! # Strategies for the remote drain, and how long the requester waits
//!
//! [`StockDrainStrategy::PerCpuWork`] makes the drain a [`PerCpuWork`] from the [`Qpw`]
//! instance, so the instance's mode decides: *queued* to the CPU's worker (mode 0, the
//! kernel's `schedule_work_on`) or *remote-locked*, run by the requester under the CPU's lock
//! (mode 1, the QPW patches: Leonardo Bras measured `drain_all_stock` at 156 275 cycles queued
//! and 58 054 remote on 128 CPUs). [`StockDrainStrategy::SkipIsolated`] is mainline's: CPUs
//! whose physical CPU the instance found isolated are left alone (with a stale FLUSHING bit),
//! and the pages their stocks keep charged are reported ([`CpuCounters::stranded`]).
//!
//! [`StockDrainWait::Async`], the default, is the kernel's: the requester queues and returns.
//! In remote mode that makes no difference (the work has run when `queue_on` returns); in queue
//! mode the stocks drain later, when each worker runs, and a charge that needed the room (the
//! retry in `try_charge_memcg()`) can fail first. [`StockDrainWait::Flush`] is ours (older
//! kernels had it as `drain_all_stock(root, sync = true)`): after queuing, the requester
//! flushes the work of every CPU whose FLUSHING bit is set, so that the stocks it saw are empty
//! when it returns and its latency is the whole drain's (what the emulator measures).
//!
//! # What this model simplifies
//!
//! The object stock (`obj_stock`, byte-sized kmem charges) and memsw accounting are left out;
//! reclaim is left out (a charge over the limit fails after one drain: with the asynchronous
//! drain in queue mode, before the workers had a chance to run, where the kernel would reclaim
//! and retry up to `MAX_RECLAIM_RETRIES` times meanwhile); eviction is round-robin instead of
//! `get_random_u32_below(NR_MEMCG_STOCK)`, so runs are reproducible; uncharging is
//! `obj_cgroup_uncharge_pages()`'s path, a `refill_stock()`. Another CPU's slots cannot be read
//! without its lock in Rust: each CPU publishes each slot as one atomic word (memcg and pages),
//! written by the owner under its lock and read by drainers. The forced drain of
//! [`Workload::drain`] is ours (the kernel has none): it waits for a running drain instead of
//! returning, ignores the FLUSHING bits, visits every CPU the strategy allows, and flushes.
//!
//! `refill_stock()` (and `consume_stock()`) only *try* the CPU's lock: in the kernel it fails
//! when the refill comes from an interrupt (or NMI) that arrived while the task on that CPU held
//! it; here, when another thread of the CPU holds it (a remote drain, a preempted task, or the
//! same thread through [`Memcg::hold_local_stock`]). A refill that cannot take it uncharges the
//! pages from the page counters directly.
//!
//! # Conservation
//!
//! Every charged page is either held by a task or sitting in exactly one stock slot, and every
//! page counter equals what its subtree holds plus what the stocks cache for its subtree:
//! `usage(m) = sum over d in subtree(m) of (held(d) + stocked(d))`, never above `max(m)`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use qpw_core::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};
use qpw_core::{CpuSet, PerCpu, PerCpuGuard, PerCpuWork, Qpw, Result, WorkCtx};

pub use crate::DrainInProgress;
use crate::{
    conservation_verdict, lock, CpuCounters, CpuLockHeld, DrainOutcome, DrainPass, OwnerCounters,
    SkipCounters, Workload, WorkloadError,
};

/// `NR_MEMCG_STOCK` (`mm/memcontrol.c`, 2025): memcgs cached per CPU.
pub const NR_MEMCG_STOCK: usize = 7;

/// `MEMCG_CHARGE_BATCH` (`include/linux/memcontrol.h`): pages charged at once, and the most a
/// stock slot keeps.
pub const MEMCG_CHARGE_BATCH: u64 = 64;

/// The limit of a memcg without one (`PAGE_COUNTER_MAX`).
pub const UNLIMITED: u64 = u64::MAX / 2;

/// Pages a task of [`Workload::process_op`] charges at most, and charges it holds per CPU.
const OP_MAX_PAGES: u64 = 4;
const OP_MAX_HELD: usize = 8;

/// A memcg, by its index in the hierarchy; 0 is the root.
pub type MemcgId = usize;

/// How `drain_all_stock` reaches the other CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StockDrainStrategy {
    /// A per-CPU work item: queued in mode 0, run remotely under the CPU's lock in mode 1.
    #[default]
    PerCpuWork,
    /// Mainline's: skip the CPUs that are isolated (their stocks stay charged, and are
    /// counted as stranded), drain the others with the per-CPU work.
    SkipIsolated,
}

/// How long `drain_all_stock` waits for the drain work it queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StockDrainWait {
    /// The kernel's: queue the work and return. A queued CPU's FLUSHING bit stays set until
    /// its worker has run the drain, and drains meanwhile skip it.
    #[default]
    Async,
    /// Ours (older kernels' `drain_all_stock(root, sync = true)`): after queuing, flush the
    /// work of every CPU whose FLUSHING bit is set, so that the stocks the drain saw are empty
    /// when it returns.
    Flush,
}

/// The memcg workload's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemcgConfig {
    /// Stock slots per CPU (`NR_MEMCG_STOCK`), 1 to 64.
    pub stock_slots: usize,
    /// Pages charged at once (`MEMCG_CHARGE_BATCH`), 1 to 127 (the kernel keeps slots in an
    /// `s8`).
    pub charge_batch: u64,
    /// Each memcg's parent; memcg 0 is the root (`None`), and every other names an earlier one.
    pub parents: Vec<Option<MemcgId>>,
    /// Each memcg's limit in pages (`memory.max`; [`UNLIMITED`] for none).
    pub limits: Vec<u64>,
    /// How remote stocks are drained.
    pub strategy: StockDrainStrategy,
    /// Whether `drain_all_stock` waits for the work it queues.
    pub wait: StockDrainWait,
}

impl Default for MemcgConfig {
    /// The kernel's constants over a small tree: the root, two children, and five leaves
    /// under each (twelve memcgs with pages, more than the seven slots, so slots get evicted).
    fn default() -> Self {
        let mut parents = vec![None, Some(0), Some(0)];
        parents.extend((0..5).map(|_| Some(1)));
        parents.extend((0..5).map(|_| Some(2)));
        let mut limits = vec![UNLIMITED; 3];
        limits.extend((0..10).map(|_| 1 << 16));
        Self {
            stock_slots: NR_MEMCG_STOCK,
            charge_batch: MEMCG_CHARGE_BATCH,
            parents,
            limits,
            strategy: StockDrainStrategy::default(),
            wait: StockDrainWait::default(),
        }
    }
}

/// What a successful or failed charge did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// Taken from the CPU's stock (`consume_stock`).
    Stock,
    /// Charged to the page counters (with the surplus of a batch put in the stock).
    Counter,
    /// Refused: `over_limit` stays over its limit even after its stocks were drained
    /// (`-ENOMEM`).
    NoMem {
        /// The memcg whose limit refused the charge (`mem_over_limit`).
        over_limit: MemcgId,
    },
}

/// One stock slot: `stock->cached[i]` and `stock->nr_pages[i]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Slot {
    cached: Option<MemcgId>,
    nr_pages: u64,
}

/// One CPU's `memcg_stock_pcp`, with the charges `process_op` holds on this CPU.
#[derive(Debug)]
struct Stock {
    slots: Vec<Slot>,
    next_evict: usize,
    counters: OwnerCounters,
    /// Charges `process_op` made on this CPU and has not released yet (the tasks' pages).
    tasks: VecDeque<(MemcgId, u64)>,
}

/// A `page_counter`: usage and limit.
#[derive(Debug)]
struct PageCounter {
    usage: AtomicU64,
    max: u64,
}

fn pack(slot: Slot) -> u64 {
    match slot.cached {
        Some(memcg) if slot.nr_pages > 0 => ((memcg as u64 + 1) << 32) | slot.nr_pages,
        _ => 0,
    }
}

fn unpack(word: u64) -> Option<(MemcgId, u64)> {
    let memcg = (word >> 32) as usize;
    (memcg > 0).then(|| (memcg - 1, word & 0xffff_ffff))
}

#[derive(Debug)]
struct Shared {
    slots: usize,
    batch: u64,
    strategy: StockDrainStrategy,
    wait: StockDrainWait,
    parents: Vec<Option<MemcgId>>,
    counters: Vec<PageCounter>,
    /// Pages held by tasks, per memcg.
    held: Vec<AtomicU64>,
    stock: PerCpu<Stock>,
    /// Per CPU (by slot index) and stock slot: the slot packed in one word ([`pack`]),
    /// published by the owner under its lock.
    hints: Vec<Vec<AtomicU64>>,
    /// Per CPU (by slot index): `FLUSHING_CACHED_CHARGE`, set by a drain that takes the CPU
    /// on, cleared by the drain work once it has drained the stock.
    flushing: Vec<AtomicBool>,
    percpu_charge_mutex: Mutex<()>,
    /// The managed CPUs that the skip-isolated strategy leaves alone.
    isolated: CpuSet,
    skips: SkipCounters,
}

impl Shared {
    /// Whether `memcg` is `root` or below it (`mem_cgroup_is_descendant`).
    fn is_descendant(&self, mut memcg: MemcgId, root: MemcgId) -> bool {
        loop {
            if memcg == root {
                return true;
            }
            match self.parents[memcg] {
                Some(parent) => memcg = parent,
                None => return false,
            }
        }
    }

    /// `page_counter_try_charge()`: charges `nr` at every level from `memcg` to the root, or
    /// none, naming the level whose limit refused.
    fn page_counter_try_charge(&self, memcg: MemcgId, nr: u64) -> Result<(), MemcgId> {
        let mut level = Some(memcg);
        while let Some(m) = level {
            let counter = &self.counters[m];
            let new = counter.usage.fetch_add(nr, Ordering::Relaxed) + nr;
            if new > counter.max {
                // Over the limit: take it back here and at every level below.
                counter.usage.fetch_sub(nr, Ordering::Relaxed);
                let mut undo = Some(memcg);
                while let Some(u) = undo.filter(|&u| u != m) {
                    self.counters[u].usage.fetch_sub(nr, Ordering::Relaxed);
                    undo = self.parents[u];
                }
                return Err(m);
            }
            level = self.parents[m];
        }
        Ok(())
    }

    /// `page_counter_uncharge()` (`memcg_uncharge()`): every level from `memcg` to the root.
    fn page_counter_uncharge(&self, memcg: MemcgId, nr: u64) {
        let mut level = Some(memcg);
        while let Some(m) = level {
            self.counters[m].usage.fetch_sub(nr, Ordering::Relaxed);
            level = self.parents[m];
        }
    }

    fn publish(&self, cpu: usize, stock: &Stock, i: usize) {
        self.hints[self.skips.idx(cpu)][i].store(pack(stock.slots[i]), Ordering::Release);
    }

    /// `drain_stock()`: uncharges slot `i` and empties it.
    fn drain_stock(&self, cpu: usize, stock: &mut Stock, i: usize) {
        let slot = std::mem::take(&mut stock.slots[i]);
        if let Some(memcg) = slot.cached {
            if slot.nr_pages > 0 {
                self.page_counter_uncharge(memcg, slot.nr_pages);
            }
        }
        self.publish(cpu, stock, i);
    }

    /// `drain_stock_fully()`.
    fn drain_stock_fully(&self, cpu: usize, stock: &mut Stock) {
        for i in 0..stock.slots.len() {
            self.drain_stock(cpu, stock, i);
        }
    }

    /// `drain_local_memcg_stock()`: the work item, run for `ctx.cpu()` wherever it runs.
    fn drain_local_stock(&self, ctx: &WorkCtx) {
        let Ok(mut stock) = self.stock.lock_work(ctx) else {
            return; // a remote run past its drain's deadline: the drain reports it
        };
        stock.counters.drained(ctx);
        self.drain_and_clear(ctx.cpu(), &mut stock);
    }

    /// Drains `cpu`'s stock and clears its FLUSHING bit, under its lock (`stock`).
    fn drain_and_clear(&self, cpu: usize, stock: &mut Stock) {
        self.drain_stock_fully(cpu, stock);
        self.flushing[self.skips.idx(cpu)].store(false, Ordering::Release);
    }

    /// `consume_stock()`.
    fn consume_stock(&self, memcg: MemcgId, nr: u64) -> Result<bool> {
        if nr > self.batch {
            return Ok(false);
        }
        let Some(mut stock) = self.stock.try_lock_local()? else {
            return Ok(false);
        };
        let cpu = PerCpuGuard::cpu(&stock);
        let Some(i) = stock.slots.iter().position(|s| s.cached == Some(memcg)) else {
            return Ok(false);
        };
        if stock.slots[i].nr_pages < nr {
            return Ok(false);
        }
        stock.slots[i].nr_pages -= nr;
        self.publish(cpu, &stock, i);
        Ok(true)
    }

    /// `refill_stock()`.
    fn refill_stock(&self, memcg: MemcgId, nr: u64) -> Result<()> {
        // A refill larger than a batch, or a busy stock: uncharge directly.
        let stock = if nr > self.batch {
            None
        } else {
            self.stock.try_lock_local()?
        };
        let Some(mut stock) = stock else {
            self.page_counter_uncharge(memcg, nr);
            return Ok(());
        };
        let cpu = PerCpuGuard::cpu(&stock);

        // Does a slot cache this memcg already?
        if let Some(i) = stock.slots.iter().position(|s| s.cached == Some(memcg)) {
            // Yes: add to it, and drain it once it holds more than a batch.
            stock.slots[i].nr_pages += nr;
            if stock.slots[i].nr_pages > self.batch {
                self.drain_stock(cpu, &mut stock, i);
            } else {
                self.publish(cpu, &stock, i);
            }
            return Ok(());
        }
        // No: take an empty slot, or evict the next one round-robin.
        let i = match stock.slots.iter().position(|s| s.cached.is_none()) {
            Some(i) => i,
            None => {
                let i = stock.next_evict;
                stock.next_evict = (i + 1) % stock.slots.len();
                self.drain_stock(cpu, &mut stock, i);
                i
            }
        };
        stock.slots[i] = Slot {
            cached: Some(memcg),
            nr_pages: nr,
        };
        self.publish(cpu, &stock, i);
        Ok(())
    }

    /// Pages the CPU at slot index `idx` caches for descendants of `root`, from its hints.
    fn stocked_under(&self, idx: usize, root: MemcgId) -> u64 {
        self.hints[idx]
            .iter()
            .filter_map(|hint| unpack(hint.load(Ordering::Acquire)))
            .filter(|&(memcg, _)| self.is_descendant(memcg, root))
            .map(|(_, nr)| nr)
            .sum()
    }
}

/// A memcg hierarchy with per-CPU charge stocks.
///
/// ```
/// use qpw_core::{CpuSpec, Policy, Qpw};
/// use qpw_workloads::memcg::{Charge, Memcg, MemcgConfig};
///
/// let qpw = Qpw::builder().cpus(CpuSpec::Logical(2)).policy(Policy::Remote).build()?;
/// let memcg = Memcg::new(&qpw, MemcgConfig::default())?;
/// {
///     let _bound = qpw.bind_current(1)?;
///     assert_eq!(memcg.try_charge(3, 1)?, Charge::Counter); // 64 charged, 63 stocked
///     assert_eq!(memcg.try_charge(3, 1)?, Charge::Stock);
/// }
/// assert_eq!((memcg.usage(3), memcg.stocked(3)), (64, 62));
/// memcg.drain_all_stock(0)?; // remote mode: drained by the time it returns
/// assert_eq!((memcg.usage(3), memcg.stocked(3)), (2, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Memcg {
    shared: Arc<Shared>,
    work: PerCpuWork,
    leaves: Vec<MemcgId>,
}

impl Memcg {
    /// The hierarchy, the stocks on `qpw`'s CPUs, and the drain work item.
    pub fn new(qpw: &Qpw, config: MemcgConfig) -> Result<Self, WorkloadError> {
        WorkloadError::check("NR_MEMCG_STOCK", config.stock_slots, 1, 64)?;
        WorkloadError::check("MEMCG_CHARGE_BATCH", config.charge_batch as usize, 1, 127)?;
        let n = config.parents.len();
        let bad = |reason: String| Err(WorkloadError::Hierarchy { reason });
        if n == 0 || config.parents[0].is_some() {
            return bad("memcg 0 must be the root (no parent)".to_string());
        }
        if config.limits.len() != n {
            return bad(format!("{n} memcgs but {} limits", config.limits.len()));
        }
        for (memcg, parent) in config.parents.iter().enumerate().skip(1) {
            match *parent {
                Some(p) if p < memcg => {}
                Some(p) => {
                    return bad(format!(
                        "memcg {memcg}'s parent {p} does not come before it"
                    ))
                }
                None => {
                    return bad(format!(
                        "memcg {memcg} has no parent: only memcg 0 may be a root"
                    ))
                }
            }
        }
        let leaves = (0..n)
            .filter(|&m| !config.parents.contains(&Some(m)))
            .collect();

        let mut isolated = CpuSet::new();
        for cpu in qpw.cpus().iter() {
            if qpw.isolated().contains(qpw.physical_cpu(cpu)?) {
                isolated.insert(cpu);
            }
        }
        let nr_cpus = qpw.cpus().len();
        let stock = qpw.per_cpu(|_| Stock {
            slots: vec![Slot::default(); config.stock_slots],
            next_evict: 0,
            counters: OwnerCounters::default(),
            tasks: VecDeque::with_capacity(OP_MAX_HELD),
        });
        let shared = Arc::new(Shared {
            slots: config.stock_slots,
            batch: config.charge_batch,
            strategy: config.strategy,
            wait: config.wait,
            counters: config
                .limits
                .iter()
                .map(|&max| PageCounter {
                    usage: AtomicU64::new(0),
                    max,
                })
                .collect(),
            held: (0..n).map(|_| AtomicU64::new(0)).collect(),
            parents: config.parents,
            stock,
            hints: (0..nr_cpus)
                .map(|_| (0..config.stock_slots).map(|_| AtomicU64::new(0)).collect())
                .collect(),
            flushing: (0..nr_cpus).map(|_| AtomicBool::new(false)).collect(),
            percpu_charge_mutex: Mutex::new(()),
            isolated,
            skips: SkipCounters::new(qpw.cpus()),
        });
        let for_work = shared.clone();
        let work = qpw.work(move |ctx| for_work.drain_local_stock(ctx))?;
        Ok(Self {
            shared,
            work,
            leaves,
        })
    }

    fn check_memcg(&self, memcg: MemcgId) -> Result<(), WorkloadError> {
        let count = self.shared.parents.len();
        if memcg < count {
            Ok(())
        } else {
            Err(WorkloadError::NoSuchMemcg { memcg, count })
        }
    }

    /// How many memcgs the hierarchy has.
    pub fn nr_memcgs(&self) -> usize {
        self.shared.parents.len()
    }

    /// The memcgs with no children, where [`Workload::process_op`] charges.
    pub fn leaves(&self) -> &[MemcgId] {
        &self.leaves
    }

    /// The managed CPUs that [`StockDrainStrategy::SkipIsolated`] leaves alone.
    pub fn isolated_cpus(&self) -> &CpuSet {
        &self.shared.isolated
    }

    /// `try_charge_memcg()`: charges `nr_pages` to `memcg` for a task of the calling CPU. Over a
    /// limit, it drains the stocks of the memcg over its limit once and retries; with the
    /// asynchronous drain, the retry may come before the queued drains have run.
    pub fn try_charge(&self, memcg: MemcgId, nr_pages: u64) -> Result<Charge, WorkloadError> {
        self.check_memcg(memcg)?;
        Ok(self.try_charge_inner(memcg, nr_pages)?)
    }

    fn try_charge_inner(&self, memcg: MemcgId, nr: u64) -> Result<Charge> {
        let shared = &*self.shared;
        let mut batch = shared.batch.max(nr);
        let mut drained = false;
        loop {
            // The stock first.
            if shared.consume_stock(memcg, nr)? {
                shared.held[memcg].fetch_add(nr, Ordering::Relaxed);
                return Ok(Charge::Stock);
            }
            // Then a whole batch from the counters, the surplus into the stock.
            match shared.page_counter_try_charge(memcg, batch) {
                Ok(()) => {
                    shared.held[memcg].fetch_add(nr, Ordering::Relaxed);
                    if batch > nr {
                        shared.refill_stock(memcg, batch - nr)?;
                    }
                    return Ok(Charge::Counter);
                }
                Err(over_limit) => {
                    // Over a limit: retry with just what is needed, then after draining the
                    // stocks that keep the over-limit memcg charged, then give up.
                    if batch > nr {
                        batch = nr;
                    } else if !drained {
                        self.drain_all_stock_inner(over_limit, false, None);
                        drained = true;
                    } else {
                        return Ok(Charge::NoMem { over_limit });
                    }
                }
            }
        }
    }

    /// Uncharges `nr_pages` that tasks hold in `memcg` (`obj_cgroup_uncharge_pages()`: the
    /// pages go back through `refill_stock` on the calling CPU).
    pub fn uncharge(&self, memcg: MemcgId, nr_pages: u64) -> Result<(), WorkloadError> {
        self.check_memcg(memcg)?;
        let held = &self.shared.held[memcg];
        held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
            h.checked_sub(nr_pages)
        })
        .map_err(|held| WorkloadError::NotCharged {
            memcg,
            nr_pages,
            held,
        })?;
        Ok(self.shared.refill_stock(memcg, nr_pages)?)
    }

    /// `drain_all_stock(root)`: drains every CPU whose stock caches a descendant of `root` and
    /// whose FLUSHING bit is clear; returns at once ([`DrainOutcome::skipped`]) when another
    /// drain is running. The caller's own CPU, if it has one, is drained directly and then
    /// counted in none of the outcome's CPU counts. With [`StockDrainWait::Async`] (the
    /// kernel's) the queued drains run later, when their workers do ([`flush_stock_work`]
    /// waits for them); with [`StockDrainWait::Flush`] they have run when this returns.
    ///
    /// [`flush_stock_work`]: Self::flush_stock_work
    pub fn drain_all_stock(&self, root: MemcgId) -> Result<DrainOutcome, WorkloadError> {
        self.check_memcg(root)?;
        Ok(self.drain_all_stock_inner(root, false, None))
    }

    /// Holds `percpu_charge_mutex` as a running drain does, for as long as the guard lives:
    /// every `drain_all_stock` meanwhile returns at once. For experiments and tests that model
    /// a long drain.
    pub fn hold_drain(&self) -> DrainInProgress<'_> {
        DrainInProgress::hold(&self.shared.percpu_charge_mutex)
    }

    fn drain_all_stock_inner(
        &self,
        root: MemcgId,
        force: bool,
        timeout: Option<Duration>,
    ) -> DrainOutcome {
        let start = Instant::now();
        let shared = &*self.shared;
        // If someone's already draining, leave it to them (a forced drain waits instead).
        let _serialised = if force {
            lock(&shared.percpu_charge_mutex)
        } else {
            // (A poisoned mutex, left by a drain that panicked, counts as held.)
            match shared.percpu_charge_mutex.try_lock() {
                Ok(guard) => guard,
                Err(_) => return DrainOutcome::whole_drain_skipped(),
            }
        };
        // The caller's own CPU, if it has one (the kernel's smp_processor_id()).
        let curcpu = shared
            .stock
            .lock_local()
            .ok()
            .map(|stock| PerCpuGuard::cpu(&stock));

        let mut pass = DrainPass::new();
        for &cpu in shared.skips.cpus() {
            let idx = shared.skips.idx(cpu);
            let flushing = &shared.flushing[idx];
            // Mainline leaves isolated CPUs alone, and their pages charged, except the caller's
            // own (drained directly): a bit set on such a CPU is never cleared by a work.
            let skips_isolated = shared.strategy == StockDrainStrategy::SkipIsolated
                && shared.isolated.contains(cpu);
            let left_alone = skips_isolated && Some(cpu) != curcpu;
            // Does this CPU cache pages of a descendant of root? (a racy peek)
            let peek = || shared.stocked_under(idx, root);
            if force {
                // Ours: every CPU the strategy allows, whatever its bit and its stock say.
                if left_alone {
                    shared.skips.skip(cpu, peek());
                    pass.skip();
                    continue;
                }
                flushing.store(true, Ordering::Release);
            } else {
                // Is a drain of this CPU on its way already (test_bit)? Then trust it. On an
                // isolated CPU nothing is on its way: the bit is stale, the pages stranded.
                // (Tested before the peek, as the kernel does: a drain that finds the bit
                // clear after the work cleared it also finds the stock the work emptied.)
                if flushing.load(Ordering::Acquire) {
                    shared
                        .skips
                        .skip(cpu, if skips_isolated { peek() } else { 0 });
                    pass.skip();
                    if !skips_isolated {
                        pass.flush_too(&self.work, cpu);
                    }
                    continue;
                }
                if peek() == 0 {
                    shared.skips.skip(cpu, 0);
                    pass.skip();
                    continue;
                }
                // Take the CPU on (test_and_set_bit), unless another drain just did.
                if flushing.swap(true, Ordering::AcqRel) {
                    shared.skips.skip(cpu, 0);
                    pass.skip();
                    pass.flush_too(&self.work, cpu);
                    continue;
                }
            }
            if Some(cpu) == curcpu {
                // The caller's own stock, directly (drain_local_memcg_stock).
                if let Ok(mut stock) = shared.stock.lock_local() {
                    shared.drain_and_clear(cpu, &mut stock);
                }
            } else if left_alone {
                // The bit stays set with no work on its way: stale.
                shared.skips.skip(cpu, peek());
                pass.skip();
            } else {
                pass.queue(&self.work, cpu);
            }
        }
        if force || shared.wait == StockDrainWait::Flush {
            pass.flush(start, timeout)
        } else {
            pass.leave_queued()
        }
    }

    /// `drain_local_memcg_stock()` on the calling thread's CPU: drains its stock and clears its
    /// FLUSHING bit, as the drain work does when it runs there. The only way, short of a forced
    /// drain, to clear a stale bit that [`StockDrainStrategy::SkipIsolated`] left on an isolated
    /// CPU. Fails when the thread has no CPU of the instance.
    pub fn drain_local_stock(&self) -> Result<()> {
        let mut stock = self.shared.stock.lock_local()?;
        let cpu = PerCpuGuard::cpu(&stock);
        self.shared.drain_and_clear(cpu, &mut stock);
        Ok(())
    }

    /// Waits for every drain work queued so far to finish (`flush_work(&stock->work)` on every
    /// CPU): what [`StockDrainWait::Flush`] does after queuing. Reports the first panic of a
    /// drain work, if any.
    pub fn flush_stock_work(&self) -> Result<()> {
        let mut first = Ok(());
        for &cpu in self.shared.skips.cpus() {
            let flushed = self.work.flush(cpu);
            if first.is_ok() {
                first = flushed;
            }
        }
        first
    }

    /// The CPUs whose FLUSHING bit is set: a drain of them is queued and has not run yet, or,
    /// on a CPU [`StockDrainStrategy::SkipIsolated`] leaves alone, the bit is stale.
    pub fn flushing_cpus(&self) -> CpuSet {
        let shared = &*self.shared;
        let mut set = CpuSet::new();
        for (&cpu, flushing) in shared.skips.cpus().iter().zip(&shared.flushing) {
            if flushing.load(Ordering::Acquire) {
                set.insert(cpu);
            }
        }
        set
    }

    /// Takes the calling thread's CPU's stock lock and keeps it until the guard is dropped, as
    /// a task interrupted inside `consume_stock()` holds it: meanwhile, on this CPU,
    /// `consume_stock` fails and `refill_stock` uncharges directly, and a drain of this CPU
    /// waits. Fails when the thread has no CPU of the instance.
    pub fn hold_local_stock(&self) -> Result<CpuLockHeld<'_>> {
        Ok(CpuLockHeld::new(self.shared.stock.lock_local()?))
    }

    /// The page counter of `memcg` (its usage, pages), or 0 for an unknown memcg.
    pub fn usage(&self, memcg: MemcgId) -> u64 {
        self.shared
            .counters
            .get(memcg)
            .map_or(0, |c| c.usage.load(Ordering::Relaxed))
    }

    /// Pages that tasks hold charged to `memcg` itself.
    pub fn held(&self, memcg: MemcgId) -> u64 {
        self.shared
            .held
            .get(memcg)
            .map_or(0, |h| h.load(Ordering::Relaxed))
    }

    /// Pages the stocks of all CPUs cache for `memcg` itself (each read under its CPU's lock).
    pub fn stocked(&self, memcg: MemcgId) -> u64 {
        let mut total = 0;
        self.shared.stock.for_each_locked(|_, stock| {
            total += stock
                .slots
                .iter()
                .filter(|s| s.cached == Some(memcg))
                .map(|s| s.nr_pages)
                .sum::<u64>();
        });
        total
    }

    /// Pages cached in each CPU's stock, in CPU order.
    pub fn stocked_per_cpu(&self) -> Vec<(usize, u64)> {
        let mut per_cpu = Vec::new();
        self.shared.stock.for_each_locked(|cpu, stock| {
            per_cpu.push((cpu, stock.slots.iter().map(|s| s.nr_pages).sum()));
        });
        per_cpu
    }
}

impl Workload for Memcg {
    fn name(&self) -> &'static str {
        "memcg"
    }

    /// A task on this CPU charges 1-4 pages to a leaf memcg, or releases its oldest charge
    /// (every third operation, and whenever it holds eight).
    fn process_op(&self) -> Result<()> {
        let shared = &*self.shared;
        let (cpu, n, release) = {
            let mut stock = shared.stock.lock_local()?;
            stock.counters.local_ops += 1;
            let n = stock.counters.local_ops;
            let release = if stock.tasks.len() >= OP_MAX_HELD || n % 3 == 0 {
                stock.tasks.pop_front()
            } else {
                None
            };
            (PerCpuGuard::cpu(&stock), n, release)
        };
        if let Some((memcg, nr)) = release {
            shared.held[memcg].fetch_sub(nr, Ordering::Relaxed);
            return shared.refill_stock(memcg, nr);
        }
        let memcg = self.leaves[(n as usize + cpu) % self.leaves.len()];
        let nr = 1 + n % OP_MAX_PAGES;
        match self.try_charge_inner(memcg, nr)? {
            Charge::Stock | Charge::Counter => {
                shared.stock.lock_local()?.tasks.push_back((memcg, nr));
            }
            Charge::NoMem { .. } => {}
        }
        Ok(())
    }

    /// `drain_all_stock(root_mem_cgroup)`, waiting or not as [`MemcgConfig::wait`] says; forced
    /// (ours), it waits for a running drain instead of returning, ignores the FLUSHING bits,
    /// drains every CPU the strategy allows, and flushes whatever `wait` says.
    fn drain(&self, force: bool, timeout: Option<Duration>) -> DrainOutcome {
        self.drain_all_stock_inner(0, force, timeout)
    }

    fn counters(&self) -> Vec<CpuCounters> {
        let shared = &*self.shared;
        shared.skips.merge(&shared.stock, |stock| stock.counters)
    }

    fn check_conservation(&self) -> Result<(), String> {
        let shared = &*self.shared;
        let n = shared.parents.len();
        let mut stocked = vec![0u64; n];
        let mut tasks = vec![0u64; n];
        let mut problems = Vec::new();
        shared.stock.for_each_locked(|cpu, stock| {
            let idx = shared.skips.idx(cpu);
            for (i, slot) in stock.slots.iter().enumerate() {
                if let Some(memcg) = slot.cached {
                    stocked[memcg] += slot.nr_pages;
                    if stock.slots[..i].iter().any(|s| s.cached == Some(memcg)) {
                        problems.push(format!("cpu {cpu} caches memcg {memcg} in two slots"));
                    }
                } else if slot.nr_pages > 0 {
                    problems.push(format!(
                        "cpu {cpu}'s empty slot {i} holds {} pages",
                        slot.nr_pages
                    ));
                }
                if slot.nr_pages > shared.batch {
                    problems.push(format!(
                        "cpu {cpu}'s slot {i} holds {} pages, more than a batch ({})",
                        slot.nr_pages, shared.batch
                    ));
                }
                let hint = shared.hints[idx][i].load(Ordering::Acquire);
                if hint != pack(*slot) {
                    problems.push(format!("cpu {cpu}'s slot {i} hint is stale"));
                }
            }
            for &(memcg, nr) in &stock.tasks {
                tasks[memcg] += nr;
            }
        });
        let held: Vec<u64> = shared
            .held
            .iter()
            .map(|h| h.load(Ordering::Relaxed))
            .collect();
        for m in 0..n {
            if tasks[m] > held[m] {
                problems.push(format!(
                    "tasks record {} pages of memcg {m}, which holds only {}",
                    tasks[m], held[m]
                ));
            }
            let expected: u64 = (0..n)
                .filter(|&d| shared.is_descendant(d, m))
                .map(|d| held[d] + stocked[d])
                .sum();
            let usage = shared.counters[m].usage.load(Ordering::Relaxed);
            if usage != expected {
                problems.push(format!(
                    "memcg {m}'s counter says {usage} pages, its subtree holds and caches {expected}"
                ));
            }
            if usage > shared.counters[m].max {
                problems.push(format!(
                    "memcg {m} is at {usage} pages, over its limit {}",
                    shared.counters[m].max
                ));
            }
        }
        debug_assert_eq!(
            shared.slots,
            shared.hints.first().map_or(shared.slots, Vec::len)
        );
        conservation_verdict(problems)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::test_support::remote;

    fn small(slots: usize, batch: u64) -> MemcgConfig {
        MemcgConfig {
            stock_slots: slots,
            charge_batch: batch,
            parents: vec![None, Some(0), Some(0), Some(1)],
            limits: vec![UNLIMITED, UNLIMITED, 100, UNLIMITED],
            strategy: StockDrainStrategy::PerCpuWork,
            wait: StockDrainWait::Async,
        }
    }

    #[test]
    fn refill_past_a_batch_drains_the_slot() {
        let qpw = remote(1);
        let memcg = Memcg::new(&qpw, small(2, 8)).unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        assert_eq!(memcg.try_charge(1, 2).unwrap(), Charge::Counter);
        assert_eq!((memcg.usage(1), memcg.stocked(1)), (8, 6));
        memcg.uncharge(1, 2).unwrap(); // 6 + 2 = 8: a batch, kept
        assert_eq!(memcg.stocked(1), 8);
        assert_eq!(memcg.try_charge(1, 8).unwrap(), Charge::Stock);
        assert_eq!(memcg.try_charge(1, 1).unwrap(), Charge::Counter);
        assert_eq!((memcg.usage(1), memcg.stocked(1)), (16, 7));
        memcg.uncharge(1, 2).unwrap(); // 7 + 2 = 9: past a batch, drained
        assert_eq!((memcg.usage(1), memcg.stocked(1), memcg.held(1)), (7, 0, 7));
        memcg.check_conservation().unwrap();
    }

    #[test]
    fn full_stock_evicts_round_robin() {
        let qpw = remote(1);
        let memcg = Memcg::new(&qpw, small(2, 8)).unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        memcg.try_charge(1, 1).unwrap();
        memcg.try_charge(3, 1).unwrap();
        assert_eq!((memcg.stocked(1), memcg.stocked(3)), (7, 7));
        memcg.try_charge(2, 1).unwrap(); // evicts slot 0, memcg 1
        assert_eq!(
            (memcg.stocked(1), memcg.stocked(2), memcg.stocked(3)),
            (0, 7, 7)
        );
        memcg.try_charge(1, 1).unwrap(); // evicts slot 1, memcg 3
        assert_eq!(
            (memcg.stocked(1), memcg.stocked(2), memcg.stocked(3)),
            (7, 7, 0)
        );
        memcg.check_conservation().unwrap();
    }

    #[test]
    fn limit_refuses_after_draining() {
        let qpw = remote(2);
        let memcg = Memcg::new(&qpw, small(2, 8)).unwrap();
        {
            let _bound = qpw.bind_current(1).unwrap();
            memcg.try_charge(2, 1).unwrap(); // cpu 1 stocks 7 pages of memcg 2
        }
        let _bound = qpw.bind_current(0).unwrap();
        // 8 + 93 > 100: fits only once cpu 1's stock is drained.
        assert_eq!(memcg.try_charge(2, 93).unwrap(), Charge::Counter);
        assert_eq!(memcg.stocked(2), 0);
        assert_eq!(
            memcg.try_charge(2, 8).unwrap(),
            Charge::NoMem { over_limit: 2 }
        );
        assert_eq!(memcg.usage(2), 94);
        memcg.check_conservation().unwrap();
    }

    #[test]
    fn conservation_catches_a_leak() {
        let qpw = remote(1);
        let memcg = Memcg::new(&qpw, small(2, 8)).unwrap();
        let _bound = qpw.bind_current(0).unwrap();
        memcg.try_charge(3, 1).unwrap();
        memcg.shared.counters[1]
            .usage
            .fetch_add(1, Ordering::Relaxed);
        let err = memcg.check_conservation().unwrap_err();
        assert!(err.contains("memcg 1's counter says 9 pages"), "{err}");
    }

    #[test]
    fn bad_input_is_named() {
        let qpw = remote(1);
        let mut config = small(2, 8);
        config.parents[2] = Some(3);
        let err = Memcg::new(&qpw, config).unwrap_err().to_string();
        assert_eq!(
            err,
            "bad memcg hierarchy: memcg 2's parent 3 does not come before it"
        );
        let err = Memcg::new(&qpw, small(2, 200)).unwrap_err().to_string();
        assert_eq!(
            err,
            "MEMCG_CHARGE_BATCH = 200 is out of range: the legal range is 1-127"
        );
        let memcg = Memcg::new(&qpw, small(2, 8)).unwrap();
        let err = memcg.try_charge(9, 1).unwrap_err().to_string();
        assert_eq!(err, "memcg 9 is not in the hierarchy of 4 memcgs (ids 0-3)");
        let err = memcg.drain_all_stock(4).unwrap_err().to_string();
        assert_eq!(err, "memcg 4 is not in the hierarchy of 4 memcgs (ids 0-3)");
        let err = memcg.uncharge(1, 1).unwrap_err().to_string();
        assert_eq!(err, "cannot uncharge 1 pages from memcg 1: it holds only 0");
    }

    #[test]
    fn pack_round_trips() {
        let slot = Slot {
            cached: Some(5),
            nr_pages: 64,
        };
        assert_eq!(unpack(pack(slot)), Some((5, 64)));
        assert_eq!(unpack(pack(Slot::default())), None);
    }
}
