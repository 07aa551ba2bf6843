//! The CPUs a command may use: the allowed ones, the isolated among them, and the default picks
//! of a measured CPU and a housekeeping one.

use anyhow::{anyhow, Context, Result};
use qpw_core::{CpuSet, Topology};

use crate::validate;

/// The CPUs a run may use, and the default target and housekeeping picks.
#[derive(Debug, Clone)]
pub struct Cpus {
    /// CPUs the process may run on.
    pub allowed: CpuSet,
    /// Isolated or nohz_full CPUs among them.
    pub isolated: CpuSet,
    /// The default measured CPU: an isolated one if any, else the last allowed one.
    pub target: usize,
}

impl Cpus {
    /// Reads them from the system.
    pub fn read() -> Result<Self> {
        let allowed = qpw_core::allowed_cpus().context("cannot read the allowed CPUs")?;
        let isolated = Topology::read()
            .map(|t| t.isolated_or_nohz_full().intersection(&allowed))
            .unwrap_or_default();
        let target = isolated
            .last()
            .or_else(|| allowed.last())
            .ok_or_else(|| anyhow!("the process may run on no CPU"))?;
        Ok(Self {
            allowed,
            isolated,
            target,
        })
    }

    /// The CPU list given with `flag`, or the default target alone when it was left out.
    pub fn list_or_target(&self, flag: &str, raw: Option<&str>) -> Result<CpuSet> {
        match raw {
            Some(list) => validate::cpu_list(flag, list, &self.allowed),
            None => Ok(CpuSet::from_iter([self.target])),
        }
    }

    /// A housekeeping CPU outside `measured`: a non-isolated one if there is one.
    pub fn housekeeping(&self, measured: &CpuSet) -> Option<usize> {
        let rest = self.allowed.difference(measured);
        let pick = rest.iter().find(|&c| !self.isolated.contains(c));
        pick.or_else(|| rest.first())
    }
}
