//! Counter files: their paths, and opening one (the fastcat `open()`, resolved once).

use super::error::ResctrlError;
use super::event::Event;
use super::model::{lock, Resctrl};

/// An open counter file: the fastcat `open()`, resolved once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonFile {
    pub(super) path: String,
    pub(super) rmid: u32,
    pub(super) generation: u64,
    pub(super) event: Event,
    pub(super) domain: usize,
}

impl MonFile {
    /// The path it was opened by.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The group's RMID.
    pub fn rmid(&self) -> u32 {
        self.rmid
    }

    /// The event.
    pub fn event(&self) -> Event {
        self.event
    }

    /// The domain.
    pub fn domain(&self) -> usize {
        self.domain
    }
}

impl Resctrl {
    /// The paths of the counter files of `groups` x `events` x `domains`, in that nesting
    /// order (`mon_groups/<g>/mon_data/mon_L3_<dd>/<event>`; the root group is `""`).
    pub fn file_paths(groups: &[&str], events: &[Event], domains: &[usize]) -> Vec<String> {
        let mut paths = Vec::with_capacity(groups.len() * events.len() * domains.len());
        for g in groups {
            for &d in domains {
                for e in events {
                    paths.push(if g.is_empty() {
                        format!("mon_data/mon_L3_{d:02}/{e}")
                    } else {
                        format!("mon_groups/{g}/mon_data/mon_L3_{d:02}/{e}")
                    });
                }
            }
        }
        paths
    }

    /// Opens a counter file (`/sys/fs/resctrl/` may prefix the path).
    pub fn open(&self, path: &str) -> Result<MonFile, ResctrlError> {
        let bad = |reason: &str| ResctrlError::BadPath {
            path: path.to_string(),
            reason: reason.to_string(),
        };
        let rel = path.strip_prefix("/sys/fs/resctrl/").unwrap_or(path);
        let parts: Vec<&str> = rel.split('/').collect();
        let (group, rest) = match parts.as_slice() {
            ["mon_groups", g, rest @ ..] => (*g, rest),
            rest => ("", rest),
        };
        let [mon_data, dir, event] = rest else {
            return Err(bad("wrong number of components"));
        };
        if *mon_data != "mon_data" {
            return Err(bad("no `mon_data` directory"));
        }
        let domain: usize = dir
            .strip_prefix("mon_L3_")
            .and_then(|d| d.parse().ok())
            .ok_or_else(|| bad("the domain directory is not `mon_L3_<number>`"))?;
        let event: Event = event.parse()?;
        self.shared.domain(domain)?;
        let state = lock(&self.shared.rdtgroup_mutex);
        let (rmid, g) = state
            .groups
            .iter()
            .enumerate()
            .find_map(|(r, g)| g.as_ref().filter(|g| g.name == group).map(|g| (r, g)))
            .ok_or_else(|| ResctrlError::NoSuchGroup {
                name: group.to_string(),
            })?;
        Ok(MonFile {
            path: path.to_string(),
            rmid: rmid as u32,
            generation: g.generation,
            event,
            domain,
        })
    }
}
