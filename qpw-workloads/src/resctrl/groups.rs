//! Monitoring groups: `mkdir` and `rmdir` under `mon_groups/`, one RMID each.

use qpw_core::sync::Ordering;

use super::abmc::CounterTable;
use super::error::ResctrlError;
use super::file::MonFile;
use super::model::{lock, Resctrl};
use super::stats::PathStats;

#[derive(Debug, Clone)]
pub(super) struct Group {
    pub(super) name: String,
    pub(super) generation: u64,
}

/// What `rdtgroup_mutex` guards.
#[derive(Debug)]
pub(super) struct RdtState {
    /// Index: RMID. RMID 0 is the root group (name "").
    pub(super) groups: Vec<Option<Group>>,
    pub(super) next_generation: u64,
    /// Each read path's record (index: [`ReadPath`](super::ReadPath) order), kept under the
    /// mutex whose hold it measures, so that recording a read needs no atomics.
    pub(super) stats: [PathStats; 4],
    /// The assignable counters' table (`mbm_event` mode), or `None`.
    pub(super) counters: Option<CounterTable>,
}

impl RdtState {
    /// Whether `file`'s group still exists (the one it was opened on, not a later group on the
    /// same RMID).
    pub(super) fn alive(&self, file: &MonFile) -> bool {
        self.groups
            .get(file.rmid as usize)
            .and_then(Option::as_ref)
            .is_some_and(|g| g.generation == file.generation)
    }
}

impl Resctrl {
    /// `mkdir mon_groups/<name>`: a new group on the lowest free RMID, its counters reset.
    pub fn mkdir(&self, name: &str) -> Result<u32, ResctrlError> {
        if name.is_empty() || name.contains('/') {
            return Err(ResctrlError::GroupName {
                name: name.to_string(),
            });
        }
        let mut state = lock(&self.shared.rdtgroup_mutex);
        if state.groups.iter().flatten().any(|g| g.name == name) {
            return Err(ResctrlError::GroupExists {
                name: name.to_string(),
            });
        }
        let Some(rmid) = state.groups.iter().position(Option::is_none) else {
            return Err(ResctrlError::NoFreeRmid {
                max: self.shared.hw.nr_rmids as u32,
            });
        };
        let generation = state.next_generation;
        state.next_generation += 1;
        state.groups[rmid] = Some(Group {
            name: name.to_string(),
            generation,
        });
        let rmid = rmid as u32;
        self.shared.hw.reset_rmid(rmid);
        self.assign_on_mkdir(&mut state, rmid);
        self.shared.hw.active[rmid as usize].store(true, Ordering::Release);
        Ok(rmid)
    }

    /// `rmdir mon_groups/<name>`: frees the RMID; files opened on it read as an error.
    pub fn rmdir(&self, name: &str) -> Result<(), ResctrlError> {
        let mut state = lock(&self.shared.rdtgroup_mutex);
        let rmid = state
            .groups
            .iter()
            .position(|g| {
                g.as_ref()
                    .is_some_and(|g| g.name == name && !name.is_empty())
            })
            .ok_or_else(|| ResctrlError::NoSuchGroup {
                name: name.to_string(),
            })?;
        state.groups[rmid] = None;
        self.release_on_rmdir(&mut state, rmid as u32);
        self.shared.hw.active[rmid].store(false, Ordering::Release);
        Ok(())
    }
}
