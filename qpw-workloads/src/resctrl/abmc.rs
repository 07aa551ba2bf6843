//! Assignable counters: AMD's ABMC, resctrl's `mbm_event` mode.
//!
//! With ABMC the hardware no longer counts bandwidth for every RMID: each L3 domain has a
//! small number of counters (32 on the parts that have it, `num_mbm_cntrs`), and an MBM event
//! of a group is counted only while one of its domain's counters is assigned to it
//! (`mbm_L3_assignments`; on `mkdir` the kernel assigns the new group's events while counters
//! are free, `mbm_assign_on_mkdir`). An event without a counter reads `Unassigned`; assigning
//! a counter starts it from zero (`resctrl_arch_reset_cntr`), so the count of an RMID that was
//! not tracked is lost, not resumed. `llc_occupancy` is not an assignable event.
//!
//! The table of which counter serves which (group, event) is kept under `rdtgroup_mutex`, as
//! the kernel keeps it; the hardware side a read checks is each event's `unassigned` flag,
//! an atomic that the interrupt path's handler can read. Assignment resets the counter before
//! it clears the flag, and both happen with the mutex held, which every read holds too (the
//! handler runs for a reader that holds it), so a read sees an event either unassigned or
//! counted from its assignment, never another RMID's count or the count from before.

use qpw_core::sync::Ordering;

use super::error::ResctrlError;
use super::event::Event;
use super::file::MonFile;
use super::groups::RdtState;
use super::model::{lock, Resctrl};

/// Counters per domain on AMD parts with ABMC (`num_mbm_cntrs`).
pub const ABMC_COUNTERS: u32 = 32;

/// The most assignable counters per domain a model may have.
pub const MAX_ASSIGNABLE_COUNTERS: u32 = 1024;

/// Per domain, which (RMID, event) each counter serves.
#[derive(Debug, Clone)]
pub(super) struct CounterTable {
    domains: Vec<Vec<Option<(u32, Event)>>>,
}

impl CounterTable {
    pub(super) fn new(domains: usize, counters: u32) -> Self {
        Self {
            domains: vec![vec![None; counters as usize]; domains],
        }
    }

    fn counter_of(&self, domain: usize, rmid: u32, event: Event) -> Option<u32> {
        self.domains
            .get(domain)?
            .iter()
            .position(|&slot| slot == Some((rmid, event)))
            .map(|c| c as u32)
    }
}

impl Resctrl {
    /// The counters per domain in `mbm_event` mode (`None`: every event is counted).
    pub fn assignable_counters(&self) -> Option<u32> {
        self.shared.assignable
    }

    /// The counter assigned to `file`'s event in its domain, if any (`mbm_event` mode).
    pub fn counter_of(&self, file: &MonFile) -> Option<u32> {
        let state = lock(&self.shared.rdtgroup_mutex);
        state
            .counters
            .as_ref()?
            .counter_of(file.domain, file.rmid, file.event)
    }

    /// Free counters of `domain` (`mbm_event` mode; 0 otherwise).
    pub fn free_counters(&self, domain: usize) -> Result<usize, ResctrlError> {
        self.shared.domain(domain)?;
        let state = lock(&self.shared.rdtgroup_mutex);
        Ok(state.counters.as_ref().map_or(0, |table| {
            table.domains[domain].iter().filter(|s| s.is_none()).count()
        }))
    }

    /// Assigns a counter of its domain to `file`'s event (a write to `mbm_L3_assignments`):
    /// the counter starts from zero. Already assigned: its counter, untouched.
    pub fn assign(&self, file: &MonFile) -> Result<u32, ResctrlError> {
        let mut state = lock(&self.shared.rdtgroup_mutex);
        self.check_assignable(&state, file)?;
        self.assign_locked(&mut state, file.domain, file.rmid, file.event)
    }

    /// Frees the counter assigned to `file`'s event: its reads show `Unassigned` until a
    /// counter is assigned again (from zero). Not assigned: nothing to do.
    pub fn unassign(&self, file: &MonFile) -> Result<(), ResctrlError> {
        let mut state = lock(&self.shared.rdtgroup_mutex);
        self.check_assignable(&state, file)?;
        self.unassign_locked(&mut state, file.domain, file.rmid, file.event);
        Ok(())
    }

    fn check_assignable(&self, state: &RdtState, file: &MonFile) -> Result<(), ResctrlError> {
        if state.counters.is_none() {
            return Err(ResctrlError::NoAssignableCounters);
        }
        if !file.event.is_mbm() {
            return Err(ResctrlError::NotAssignable { event: file.event });
        }
        if !state.alive(file) {
            return Err(ResctrlError::GroupRemoved {
                path: file.path.clone(),
            });
        }
        Ok(())
    }

    /// With `rdtgroup_mutex` held: a free counter of `domain` for (`rmid`, `event`).
    pub(super) fn assign_locked(
        &self,
        state: &mut RdtState,
        domain: usize,
        rmid: u32,
        event: Event,
    ) -> Result<u32, ResctrlError> {
        let hw = &self.shared.hw;
        let Some(table) = state.counters.as_mut() else {
            return Err(ResctrlError::NoAssignableCounters);
        };
        if let Some(counter) = table.counter_of(domain, rmid, event) {
            return Ok(counter);
        }
        let slots = &mut table.domains[domain];
        let Some(counter) = slots.iter().position(Option::is_none) else {
            return Err(ResctrlError::NoFreeCounter {
                domain,
                max: slots.len(),
            });
        };
        slots[counter] = Some((rmid, event));
        // The counter starts from zero, then the event is counted: a read (which holds the
        // mutex too) sees it unassigned, or counted from here.
        let i = hw.idx(domain, rmid, event);
        hw.reset_counter(i);
        hw.unassigned[i].store(false, Ordering::Release);
        Ok(counter as u32)
    }

    /// With `rdtgroup_mutex` held: frees the counter of (`rmid`, `event`) in `domain`.
    pub(super) fn unassign_locked(
        &self,
        state: &mut RdtState,
        domain: usize,
        rmid: u32,
        event: Event,
    ) {
        let hw = &self.shared.hw;
        hw.unassigned[hw.idx(domain, rmid, event)].store(true, Ordering::Release);
        if let Some(table) = state.counters.as_mut() {
            for slot in &mut table.domains[domain] {
                if *slot == Some((rmid, event)) {
                    *slot = None;
                }
            }
        }
    }

    /// `mkdir` in `mbm_event` mode (`mbm_assign_on_mkdir`): the new group's MBM events start
    /// unassigned and get a counter in every domain that has one free.
    pub(super) fn assign_on_mkdir(&self, state: &mut RdtState, rmid: u32) {
        if state.counters.is_none() {
            return;
        }
        for domain in 0..self.shared.domains.len() {
            for event in Event::ALL.into_iter().filter(|e| e.is_mbm()) {
                self.unassign_locked(state, domain, rmid, event);
                // No free counter: the event stays unassigned, as in the kernel.
                let _ = self.assign_locked(state, domain, rmid, event);
            }
        }
    }

    /// `rmdir` in `mbm_event` mode: the group's counters are freed.
    pub(super) fn release_on_rmdir(&self, state: &mut RdtState, rmid: u32) {
        if state.counters.is_none() {
            return;
        }
        for domain in 0..self.shared.domains.len() {
            for event in Event::ALL.into_iter().filter(|e| e.is_mbm()) {
                self.unassign_locked(state, domain, rmid, event);
            }
        }
    }
}
