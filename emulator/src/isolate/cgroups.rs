//! Step 4, the scheduler domains: which cpuset hierarchy the machine has, and the cgroup v1
//! shield (the v2 partition is [`super::partition`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use qpw_core::CpuSet;

use super::{change_file, partition, persist, Saved};

/// The cgroup hierarchies that have the cpuset controller.
pub(super) struct Cgroups {
    pub(super) v1_cpuset: Option<V1Cpuset>,
    /// The cgroup v2 root, where it has the cpuset controller.
    pub(super) v2_cpuset: Option<PathBuf>,
}

/// A cgroup v1 cpuset hierarchy: where it is mounted, and its files' prefix (`cpuset.`, or
/// none when mounted with `noprefix`).
#[derive(Debug, Clone)]
pub(super) struct V1Cpuset {
    pub(super) root: PathBuf,
    pub(super) prefix: &'static str,
}

impl V1Cpuset {
    pub(super) fn file(&self, dir: &Path, name: &str) -> PathBuf {
        dir.join(format!("{}{name}", self.prefix))
    }
}

impl Cgroups {
    pub(super) fn find() -> Self {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let mut v1_cpuset = None;
        for line in mounts.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [_, dir, kind, opts, ..] = f[..] else {
                continue;
            };
            if kind == "cgroup" && opts.split(',').any(|o| o == "cpuset") && v1_cpuset.is_none() {
                let noprefix = opts.split(',').any(|o| o == "noprefix");
                v1_cpuset = Some(V1Cpuset {
                    root: PathBuf::from(dir),
                    prefix: if noprefix { "" } else { "cpuset." },
                });
            }
        }
        Self {
            v1_cpuset,
            v2_cpuset: partition::v2_root(&mounts),
        }
    }
}

/// Whether `--isolate` here makes a cgroup v2 isolated partition (cgroup v2 has the cpuset
/// controller and no v1 cpuset hierarchy is mounted), and so holds the measured CPUs for our
/// own process's threads alone.
pub fn makes_v2_partition() -> bool {
    matches!(
        Cgroups::find(),
        Cgroups {
            v1_cpuset: None,
            v2_cpuset: Some(_)
        }
    )
}

/// Why kernel-memcg cannot run under a cgroup v2 partition.
pub const NO_MEMCG_UNDER_PARTITION: &str = "under --isolate's cgroup v2 partition the measured \
     CPU takes threads of this process only, and kernel-memcg's filler must sit in a memory \
     cgroup of its own, so it cannot reach the CPU to fill its stock (boot isolation, without \
     --isolate, has no such limit)";

/// The v1 shield's scheduler-domain part: the root stops balancing, a task-less child cpuset
/// of the housekeeping CPUs keeps balancing them.
pub(super) fn shield_v1(
    v1: &V1Cpuset,
    cpus: &CpuSet,
    housekeeping: &CpuSet,
    s: &mut Saved,
    state_file: &Option<PathBuf>,
) -> Result<String> {
    let root = &v1.root;
    let balance = v1.file(root, "sched_load_balance");
    let old = std::fs::read_to_string(&balance)
        .with_context(|| format!("cannot read {}", balance.display()))?;
    let child = root.join(format!("qpw-emu-housekeeping-{}", std::process::id()));
    let mems = std::fs::read_to_string(v1.file(root, "mems"))
        .with_context(|| format!("cannot read {}", v1.file(root, "mems").display()))?;
    s.dirs.push(child.clone());
    persist(s, state_file);
    std::fs::create_dir(&child).with_context(|| format!("cannot create {}", child.display()))?;
    let write = |name: &str, value: &str| -> Result<()> {
        let f = v1.file(&child, name);
        std::fs::write(&f, value)
            .with_context(|| format!("cannot write {value:?} to {}", f.display()))
    };
    write("cpus", &housekeeping.to_string())?;
    write("mems", mems.trim())?;
    write("sched_load_balance", "1")?;
    change_file(s, state_file, &balance, &old, None, "0")
        .with_context(|| format!("cannot write 0 to {}", balance.display()))?;
    // Other cpusets that balance over the measured CPUs keep them in a domain: say so.
    let mut others = Vec::new();
    if let Ok(dir) = std::fs::read_dir(root) {
        for e in dir.flatten() {
            let p = e.path();
            if !p.is_dir() || p == child {
                continue;
            }
            let balances = std::fs::read_to_string(v1.file(&p, "sched_load_balance"))
                .is_ok_and(|b| b.trim() == "1");
            let theirs = std::fs::read_to_string(v1.file(&p, "cpus"))
                .ok()
                .and_then(|c| CpuSet::parse(c.trim()).ok())
                .unwrap_or_default();
            if balances && !theirs.intersection(cpus).is_empty() {
                others.push(p.display().to_string());
            }
        }
    }
    let mut step = format!(
        "scheduler domains: cgroup v1 shield ({} = 0, {} balances {housekeeping})",
        balance.display(),
        child.display()
    );
    if !others.is_empty() {
        step.push_str(&format!(
            "; but {} still balance(s) over cpu {cpus}",
            others.join(", ")
        ));
    }
    Ok(step)
}
