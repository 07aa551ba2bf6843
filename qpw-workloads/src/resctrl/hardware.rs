//! The hardware counters and the arch layer's per-counter state:
//! `resctrl_arch_rmid_read`, with the wrap folded by `mbm_overflow_count`.

use std::time::Instant;

use qpw_core::sync::{AtomicBool, AtomicU64, Ordering};

use super::event::Event;
use super::file::MonFile;
use super::model::Resctrl;
use super::overflow::CacheEntry;
use super::value::ReadValue;

/// The hardware and the arch layer's per-counter state. Everything a signal handler touches
/// is an atomic; the arch state (`prev_msr`, `chunks`) is only written under `rdtgroup_mutex`,
/// directly or by a handler a mutex holder is waiting for.
#[derive(Debug)]
pub(super) struct Hardware {
    pub(super) nr_domains: usize,
    pub(super) nr_rmids: usize,
    pub(super) width: u32,
    pub(super) scale: u64,
    /// CPU -> domain (`usize::MAX`: none).
    pub(super) domain_of: Vec<usize>,
    /// CPU -> the physical CPU its threads run on (itself, unless the CPUs are logical).
    pub(super) phys_of: Vec<usize>,
    /// What the hardware has counted, in bytes, never truncated (occupancy: the level).
    pub(super) truth: Box<[AtomicU64]>,
    /// `arch_mbm_state::prev_msr`.
    pub(super) prev_msr: Box<[AtomicU64]>,
    /// `arch_mbm_state::chunks`, since the group's reset.
    pub(super) chunks: Box<[AtomicU64]>,
    /// The untruncated chunk count at the group's reset, for [`Resctrl::source_bytes`].
    pub(super) base_chunks: Box<[AtomicU64]>,
    pub(super) unassigned: Box<[AtomicBool]>,
    pub(super) unavailable: Box<[AtomicBool]>,
    pub(super) cache: Box<[CacheEntry]>,
    /// Per RMID: whether a group owns it.
    pub(super) active: Box<[AtomicBool]>,
    pub(super) violations: AtomicU64,
    pub(super) epoch: Instant,
}

pub(super) fn atomics(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

pub(super) fn flags(n: usize) -> Box<[AtomicBool]> {
    (0..n).map(|_| AtomicBool::new(false)).collect()
}

/// Where a read executes: the CPU of the model it executes for (the reader's binding, the
/// worker's CPU, the CPU an interrupted thread is registered for) and the physical CPU the
/// executing thread runs on at that moment (`sched_getcpu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Executing {
    pub(super) cpu: usize,
    pub(super) phys: Option<usize>,
}

impl Executing {
    /// For `cpu`, on the physical CPU the calling thread runs on now.
    #[inline]
    pub(super) fn now(cpu: usize) -> Self {
        Self {
            cpu,
            phys: qpw_core::current_cpu(),
        }
    }
}

/// `mbm_overflow_count`: chunks counted between two reads of a `width`-bit counter, assuming
/// it wrapped at most once.
#[inline]
pub fn mbm_overflow_count(prev_msr: u64, cur_msr: u64, width: u32) -> u64 {
    let shift = 64 - width;
    (cur_msr << shift).wrapping_sub(prev_msr << shift) >> shift
}

impl Hardware {
    #[inline]
    pub(super) fn idx(&self, domain: usize, rmid: u32, event: Event) -> usize {
        (domain * self.nr_rmids + rmid as usize) * 3 + event.idx()
    }

    /// The value in `QM_CTR`: the count in chunks, truncated to the counter width.
    #[inline]
    fn msr(&self, i: usize) -> u64 {
        let chunks = self.truth[i].load(Ordering::Relaxed) / self.scale;
        chunks & ((1u64 << self.width) - 1)
    }

    pub(super) fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// The hardware rule: whether a read executing at `on` reaches `domain`'s counters. The
    /// MSRs of a CPU reach only its own domain's counters, and the CPU is the one the thread
    /// runs on at the moment of the read: a thread bound to (or registered for, or working
    /// for) a CPU of the domain but running on another physical CPU reads another domain's
    /// counters. Under loom no thread runs anywhere, and only the first half is checked.
    #[inline]
    fn reaches(&self, on: Option<Executing>, domain: usize) -> bool {
        let Some(on) = on else {
            return false;
        };
        let in_domain = self.domain_of.get(on.cpu) == Some(&domain);
        let on_its_cpu =
            cfg!(loom) || on.phys.is_some() && on.phys == self.phys_of.get(on.cpu).copied();
        in_domain && on_its_cpu
    }

    /// `resctrl_arch_rmid_read`, executed at `on`. Async-signal-safe (atomics only): the
    /// interrupt path's handler calls it. The caller holds `rdtgroup_mutex` or is a handler a
    /// holder waits for.
    pub(super) fn rmid_read(
        &self,
        on: Option<Executing>,
        domain: usize,
        rmid: u32,
        event: Event,
    ) -> ReadValue {
        if !self.reaches(on, domain) {
            self.violations.fetch_add(1, Ordering::Relaxed);
            return ReadValue::Error;
        }
        if domain >= self.nr_domains || rmid as usize >= self.nr_rmids {
            return ReadValue::Error;
        }
        let i = self.idx(domain, rmid, event);
        if self.unassigned[i].load(Ordering::Acquire) {
            return ReadValue::Unassigned;
        }
        if self.unavailable[i].load(Ordering::Relaxed) {
            return ReadValue::Unavailable;
        }
        let msr = self.msr(i);
        if !event.is_mbm() {
            return ReadValue::Value(msr * self.scale);
        }
        // Fold the wrap since the last read of this counter into the 64-bit total.
        let prev = self.prev_msr[i].load(Ordering::Relaxed);
        let chunks =
            self.chunks[i].load(Ordering::Relaxed) + mbm_overflow_count(prev, msr, self.width);
        self.prev_msr[i].store(msr, Ordering::Relaxed);
        self.chunks[i].store(chunks, Ordering::Relaxed);
        ReadValue::Value(chunks * self.scale)
    }

    /// `resctrl_arch_reset_rmid` for every event of `rmid` in every domain (see the module
    /// docs: done without a cross-CPU read), every event counted.
    pub(super) fn reset_rmid(&self, rmid: u32) {
        for d in 0..self.nr_domains {
            for e in Event::ALL {
                let i = self.idx(d, rmid, e);
                self.reset_counter(i);
                self.unassigned[i].store(false, Ordering::Relaxed);
                self.unavailable[i].store(false, Ordering::Relaxed);
            }
        }
    }

    /// Counter `i` counts from zero from now on (`resctrl_arch_reset_cntr` and the arch
    /// state with it), and its cached sample is gone.
    pub(super) fn reset_counter(&self, i: usize) {
        // One load, so that the base and the MSR snapshot agree even while traffic flows.
        let raw = self.truth[i].load(Ordering::Relaxed) / self.scale;
        self.base_chunks[i].store(raw, Ordering::Relaxed);
        self.prev_msr[i].store(raw & ((1u64 << self.width) - 1), Ordering::Relaxed);
        self.chunks[i].store(0, Ordering::Relaxed);
        let c = &self.cache[i];
        c.at.store(0, Ordering::Relaxed);
        c.status.store(0, Ordering::Relaxed);
        c.value.store(0, Ordering::Relaxed);
        c.rate.store(0, Ordering::Relaxed);
    }
}

impl Resctrl {
    /// What the hardware has counted for `file` since its group was created, in bytes (a
    /// multiple of `mon_scale`): what a read must agree with. For `llc_occupancy`, the level.
    pub fn source_bytes(&self, file: &MonFile) -> u64 {
        let hw = &self.shared.hw;
        let i = hw.idx(file.domain, file.rmid, file.event);
        let raw = hw.truth[i].load(Ordering::Relaxed) / hw.scale;
        if file.event.is_mbm() {
            (raw - hw.base_chunks[i].load(Ordering::Relaxed)) * hw.scale
        } else {
            (raw & ((1u64 << hw.width) - 1)) * hw.scale
        }
    }

    /// Marks `file`'s counter unassigned (or assigned again): reads show `Unassigned`.
    pub fn set_unassigned(&self, file: &MonFile, unassigned: bool) {
        let hw = &self.shared.hw;
        hw.unassigned[hw.idx(file.domain, file.rmid, file.event)]
            .store(unassigned, Ordering::Relaxed);
    }

    /// Sets the hardware's Unavailable bit for `file`'s counter.
    pub fn set_unavailable(&self, file: &MonFile, unavailable: bool) {
        let hw = &self.shared.hw;
        hw.unavailable[hw.idx(file.domain, file.rmid, file.event)]
            .store(unavailable, Ordering::Relaxed);
    }
}
