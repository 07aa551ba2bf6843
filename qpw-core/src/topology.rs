//! What the machine's CPUs look like: possible and online CPUs, isolated and `nohz_full` CPUs,
//! L3 cache domains, and a housekeeping pick.
//!
//! Everything is read from a sysfs root (`/sys` by default) so that tests can point it at a
//! fake tree built with [`FakeSysfs`]. The files read are those the kernel documents in
//! `Documentation/ABI/testing/sysfs-devices-system-cpu`:
//!
//! | file under the root | meaning |
//! |---|---|
//! | `devices/system/cpu/possible`, `online` | CPU lists (required) |
//! | `devices/system/cpu/isolated` | CPUs given to `isolcpus=` (absent or empty: none) |
//! | `devices/system/cpu/nohz_full` | CPUs given to `nohz_full=` (absent, empty or `(null)`: none) |
//! | `fs/cgroup/cpuset.cpus.isolated` | CPUs isolated at run time by cgroup v2 isolated partitions (absent, on cgroup v1 or without the cpuset controller: none) |
//! | `fs/cgroup/**/cpuset.cpus.partition`, `cpuset.cpus.effective` | where `cpuset.cpus.isolated` is missing (Linux before 6.8), the same CPUs read from the partitions themselves: each valid `isolated` partition's effective CPUs |
//! | `devices/system/cpu/cpuN/cache/indexM/{level,shared_cpu_list}` | the CPUs sharing each cache |

use std::fs;
use std::path::{Path, PathBuf};

use crate::{CpuSet, Error, Result};

/// The CPU topology, read once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    root: PathBuf,
    possible: CpuSet,
    online: CpuSet,
    isolated: CpuSet,
    nohz_full: CpuSet,
    runtime_isolated: CpuSet,
    l3_domains: Vec<CpuSet>,
}

impl Topology {
    /// Reads the running system's topology from `/sys`.
    pub fn read() -> Result<Self> {
        Self::read_from("/sys")
    }

    /// Reads the topology from a sysfs root (the directory that holds `devices/`).
    pub fn read_from(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let cpu_dir = root.join("devices/system/cpu");
        let possible = read_list(&cpu_dir.join("possible"), true)?;
        let online = read_list(&cpu_dir.join("online"), true)?;
        let isolated = read_list(&cpu_dir.join("isolated"), false)?;
        let nohz_full = read_list(&cpu_dir.join("nohz_full"), false)?;
        let runtime_isolated = runtime_isolated(&root.join("fs/cgroup"))?;

        // One domain per distinct L3 `shared_cpu_list`, in the order of their first CPU.
        let mut l3_domains: Vec<CpuSet> = Vec::new();
        for cpu in online.iter() {
            let cache = cpu_dir.join(format!("cpu{cpu}/cache"));
            let Ok(entries) = fs::read_dir(&cache) else {
                continue;
            };
            for entry in entries.flatten() {
                let dir = entry.path();
                let level = fs::read_to_string(dir.join("level")).unwrap_or_default();
                if level.trim() != "3" {
                    continue;
                }
                let shared = read_list(&dir.join("shared_cpu_list"), true)?;
                if !l3_domains.contains(&shared) {
                    l3_domains.push(shared);
                }
            }
        }
        l3_domains.sort_by_key(|d| d.first());

        Ok(Self {
            root,
            possible,
            online,
            isolated,
            nohz_full,
            runtime_isolated,
            l3_domains,
        })
    }

    /// The sysfs root this was read from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// CPUs that could ever be online.
    pub fn possible(&self) -> &CpuSet {
        &self.possible
    }

    /// CPUs online now.
    pub fn online(&self) -> &CpuSet {
        &self.online
    }

    /// CPUs isolated with `isolcpus=`.
    pub fn isolated(&self) -> &CpuSet {
        &self.isolated
    }

    /// CPUs running tickless with `nohz_full=`.
    pub fn nohz_full(&self) -> &CpuSet {
        &self.nohz_full
    }

    /// CPUs isolated at run time, by cgroup v2 isolated partitions
    /// (`/sys/fs/cgroup/cpuset.cpus.isolated` from Linux 6.8; before it, read from the
    /// partitions themselves: the same isolation tuned can set up without a reboot).
    pub fn runtime_isolated(&self) -> &CpuSet {
        &self.runtime_isolated
    }

    /// CPUs isolated any way (`isolcpus=`, `nohz_full=`, or a run-time isolated partition):
    /// the ones [`Policy::Auto`](crate::Policy::Auto) and
    /// [`Policy::Isolated`](crate::Policy::Isolated) put in remote mode.
    pub fn isolated_or_nohz_full(&self) -> CpuSet {
        self.isolated
            .union(&self.nohz_full)
            .union(&self.runtime_isolated)
    }

    /// The L3 cache domains, each the set of CPUs sharing one L3 (empty when sysfs has no cache
    /// information, as in some VMs and containers).
    pub fn l3_domains(&self) -> &[CpuSet] {
        &self.l3_domains
    }

    /// The L3 domain holding `cpu`.
    pub fn l3_domain_of(&self, cpu: usize) -> Option<&CpuSet> {
        self.l3_domains.iter().find(|d| d.contains(cpu))
    }

    /// A housekeeping CPU (online, neither isolated nor `nohz_full`) in `within`, like the
    /// kernel's `cpumask_any_housekeeping()`: the lowest such CPU; if `within` has none, the
    /// lowest online CPU of `within`, as the kernel falls back to any CPU of the mask.
    pub fn housekeeping_cpu(&self, within: &CpuSet) -> Option<usize> {
        let candidates = within.intersection(&self.online);
        let isolated = self.isolated_or_nohz_full();
        let housekeeping = candidates.iter().find(|&c| !isolated.contains(c));
        housekeeping.or_else(|| candidates.first())
    }
}

/// The CPUs of the isolated partitions under a cgroup v2 root: `cpuset.cpus.isolated` where
/// the kernel has it (6.8 and later), else every valid `isolated` partition's effective CPUs.
/// Before 6.7 a partition's parent must itself be a partition root, so the walk goes down only
/// through partition roots; from 6.7 a "remote" partition may sit anywhere, but those kernels
/// have `cpuset.cpus.isolated`. Not a cgroup v2 root, or no cpuset controller: none.
fn runtime_isolated(cgroup: &Path) -> Result<CpuSet> {
    let summary = cgroup.join("cpuset.cpus.isolated");
    if summary.exists() {
        return read_list(&summary, false);
    }
    let mut found = CpuSet::new();
    let mut dirs = vec![cgroup.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let child = entry.path();
            let Ok(kind) = fs::read_to_string(child.join("cpuset.cpus.partition")) else {
                continue;
            };
            // "isolated invalid (...)" and "root invalid (...)" isolate nothing.
            match kind.trim() {
                "isolated" => {
                    found = found.union(&read_list(&child.join("cpuset.cpus.effective"), false)?)
                }
                "root" => dirs.push(child),
                _ => {}
            }
        }
    }
    Ok(found)
}

/// The CPUs isolated now, any way ([`Topology::isolated_or_nohz_full`]), read from `/sys`
/// without the rest of the topology; none where sysfs cannot be read.
#[cfg(not(loom))]
pub(crate) fn isolated_now() -> CpuSet {
    let root = Path::new("/sys");
    let cpu_dir = root.join("devices/system/cpu");
    let read = |p: &Path| read_list(p, false).unwrap_or_default();
    read(&cpu_dir.join("isolated"))
        .union(&read(&cpu_dir.join("nohz_full")))
        .union(&runtime_isolated(&root.join("fs/cgroup")).unwrap_or_default())
        .intersection(&read(&cpu_dir.join("online")))
}

/// The CPUs the calling process's cpuset lets its threads use (`sched_setaffinity` refuses the
/// others): the effective CPUs of its cgroup, or of the nearest ancestor that has the file, on
/// cgroup v2 or v1. `None` where no cpuset controller is mounted or the files cannot be read.
#[cfg(not(loom))]
pub(crate) fn process_cpuset() -> Option<CpuSet> {
    let cgroups = fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    cpuset_of(&cgroups, &mounts, |p| fs::read_to_string(p).ok())
}

/// [`process_cpuset`] over the texts of `/proc/self/cgroup` and `/proc/self/mounts`, with
/// `read` reading a file.
#[cfg(not(loom))]
fn cpuset_of(
    cgroups: &str,
    mounts: &str,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<CpuSet> {
    for m in mounts.lines() {
        let f: Vec<&str> = m.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        // v1: a hierarchy with the cpuset controller, and our line `N:...cpuset...:/path`;
        // v2: the unified hierarchy, and our line `0::/path`.
        let (rel, file) = if f[2] == "cgroup" && f[3].split(',').any(|o| o == "cpuset") {
            let line = cgroups.lines().find(|l| {
                l.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|c| c == "cpuset"))
            })?;
            let noprefix = f[3].split(',').any(|o| o == "noprefix");
            let file = if noprefix {
                "effective_cpus"
            } else {
                "cpuset.effective_cpus"
            };
            (line.splitn(3, ':').nth(2)?, file)
        } else if f[2] == "cgroup2" {
            let Some(line) = cgroups.lines().find(|l| l.starts_with("0::")) else {
                continue;
            };
            (&line[3..], "cpuset.cpus.effective")
        } else {
            continue;
        };
        let mut dir = Path::new(f[1]).join(rel.trim_start_matches('/'));
        loop {
            if let Some(set) = read(&dir.join(file)).and_then(|t| t.trim().parse().ok()) {
                return Some(set);
            }
            if dir == Path::new(f[1]) || !dir.pop() {
                break;
            }
        }
    }
    None
}

fn read_list(path: &Path, required: bool) -> Result<CpuSet> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => return Ok(CpuSet::new()),
        Err(source) => {
            return Err(Error::Topology {
                path: path.to_path_buf(),
                source: source.into(),
            })
        }
    };
    // `nohz_full` reads `(null)` when the boot parameter was not given.
    let text = text.trim();
    if text == "(null)" {
        return Ok(CpuSet::new());
    }
    text.parse().map_err(|e| Error::TopologySyntax {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

/// Writes a fake sysfs tree, for tests and examples that need a topology this machine lacks
/// (isolated CPUs, several L3 domains).
///
/// ```
/// use qpw_core::{FakeSysfs, Topology};
///
/// let dir = std::env::temp_dir().join(format!("qpw-doc-{}", std::process::id()));
/// FakeSysfs::new("0-3").isolated("3").l3_domains(&["0-1", "2-3"]).write(&dir)?;
/// let topo = Topology::read_from(&dir)?;
/// assert_eq!(topo.isolated().to_string(), "3");
/// assert_eq!(topo.housekeeping_cpu(&"2-3".parse()?), Some(2));
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct FakeSysfs {
    online: String,
    isolated: Option<String>,
    nohz_full: Option<String>,
    runtime_isolated: Option<String>,
    partitions: Vec<(String, String, String)>,
    l3_domains: Vec<String>,
}

impl FakeSysfs {
    /// A tree whose possible and online CPUs are `online`.
    pub fn new(online: &str) -> Self {
        Self {
            online: online.to_string(),
            isolated: None,
            nohz_full: None,
            runtime_isolated: None,
            partitions: Vec::new(),
            l3_domains: Vec::new(),
        }
    }

    /// Writes `isolated`.
    pub fn isolated(mut self, list: &str) -> Self {
        self.isolated = Some(list.to_string());
        self
    }

    /// Writes `nohz_full` (`(null)` is what the kernel writes when unset).
    pub fn nohz_full(mut self, list: &str) -> Self {
        self.nohz_full = Some(list.to_string());
        self
    }

    /// Writes `fs/cgroup/cpuset.cpus.isolated`, the CPUs of cgroup v2 isolated partitions.
    pub fn runtime_isolated(mut self, list: &str) -> Self {
        self.runtime_isolated = Some(list.to_string());
        self
    }

    /// Writes a cgroup v2 cpuset partition at `path` under `fs/cgroup` as a kernel without
    /// `cpuset.cpus.isolated` (before 6.8) shows it: its `cpuset.cpus.partition` (`root`,
    /// `isolated`, `member`, or an invalid state such as `isolated invalid (...)`) and its
    /// `cpuset.cpus.effective`.
    pub fn partition(mut self, path: &str, kind: &str, effective: &str) -> Self {
        self.partitions
            .push((path.to_string(), kind.to_string(), effective.to_string()));
        self
    }

    /// Writes one L3 cache (`index3`) per list, shared by the CPUs in it.
    pub fn l3_domains(mut self, lists: &[&str]) -> Self {
        self.l3_domains = lists.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Writes the tree under `root`.
    pub fn write(&self, root: &Path) -> std::io::Result<()> {
        let cpu_dir = root.join("devices/system/cpu");
        fs::create_dir_all(&cpu_dir)?;
        fs::write(cpu_dir.join("possible"), format!("{}\n", self.online))?;
        fs::write(cpu_dir.join("online"), format!("{}\n", self.online))?;
        if let Some(list) = &self.isolated {
            fs::write(cpu_dir.join("isolated"), format!("{list}\n"))?;
        }
        if let Some(list) = &self.nohz_full {
            fs::write(cpu_dir.join("nohz_full"), format!("{list}\n"))?;
        }
        if let Some(list) = &self.runtime_isolated {
            let cgroup = root.join("fs/cgroup");
            fs::create_dir_all(&cgroup)?;
            fs::write(cgroup.join("cpuset.cpus.isolated"), format!("{list}\n"))?;
        }
        for (path, kind, effective) in &self.partitions {
            let dir = root.join("fs/cgroup").join(path);
            fs::create_dir_all(&dir)?;
            fs::write(dir.join("cpuset.cpus.partition"), format!("{kind}\n"))?;
            fs::write(dir.join("cpuset.cpus.effective"), format!("{effective}\n"))?;
        }
        for list in &self.l3_domains {
            let set: CpuSet = list
                .parse()
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            for cpu in set.iter() {
                let dir = cpu_dir.join(format!("cpu{cpu}/cache/index3"));
                fs::create_dir_all(&dir)?;
                fs::write(dir.join("level"), "3\n")?;
                fs::write(dir.join("shared_cpu_list"), format!("{list}\n"))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_fake_tree() {
        let dir = tempfile::tempdir().unwrap();
        FakeSysfs::new("0-7")
            .isolated("6-7")
            .nohz_full("5-7")
            .l3_domains(&["0-3", "4-7"])
            .write(dir.path())
            .unwrap();
        let topo = Topology::read_from(dir.path()).unwrap();
        assert_eq!(topo.online().to_string(), "0-7");
        assert_eq!(topo.isolated_or_nohz_full().to_string(), "5-7");
        assert_eq!(topo.l3_domains().len(), 2);
        assert_eq!(topo.l3_domain_of(5).unwrap().to_string(), "4-7");
        assert_eq!(topo.housekeeping_cpu(&"4-7".parse().unwrap()), Some(4));
        // A mask of isolated CPUs only: fall back to any of them, as the kernel does.
        assert_eq!(topo.housekeeping_cpu(&"6-7".parse().unwrap()), Some(6));
        assert_eq!(topo.housekeeping_cpu(&"9".parse().unwrap()), None);
    }

    #[test]
    fn unset_nohz_full_reads_null() {
        let dir = tempfile::tempdir().unwrap();
        FakeSysfs::new("0-1")
            .nohz_full("(null)")
            .write(dir.path())
            .unwrap();
        let topo = Topology::read_from(dir.path()).unwrap();
        assert!(topo.nohz_full().is_empty());
        assert!(topo.isolated().is_empty());
        assert!(topo.l3_domains().is_empty());
    }

    #[test]
    fn missing_or_bad_files_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = Topology::read_from(dir.path()).unwrap_err().to_string();
        assert!(err.contains("devices/system/cpu/possible"), "{err}");

        FakeSysfs::new("0-1")
            .isolated("1-")
            .write(dir.path())
            .unwrap();
        let err = Topology::read_from(dir.path()).unwrap_err().to_string();
        assert!(err.contains("isolated") && err.contains("`1-`"), "{err}");
    }

    #[test]
    fn before_6_8_isolated_partitions_are_read_from_the_partitions() {
        let dir = tempfile::tempdir().unwrap();
        FakeSysfs::new("0-7")
            .partition("rt", "isolated", "6")
            .partition("pool", "root", "4-5")
            .partition("pool/iso", "isolated", "5")
            .partition("member", "member", "0-3")
            .partition(
                "bad",
                "isolated invalid (Cpu list in cpuset.cpus not exclusive)",
                "",
            )
            .partition("member/under", "isolated", "3")
            .write(dir.path())
            .unwrap();
        let topo = Topology::read_from(dir.path()).unwrap();
        // A partition under a member cannot be valid before 6.7: the walk does not go there.
        assert_eq!(topo.runtime_isolated().to_string(), "5-6");
        assert_eq!(topo.isolated_or_nohz_full().to_string(), "5-6");
    }

    #[test]
    fn the_kernels_summary_wins_where_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        FakeSysfs::new("0-3")
            .runtime_isolated("3")
            .partition("old", "isolated", "2")
            .write(dir.path())
            .unwrap();
        let topo = Topology::read_from(dir.path()).unwrap();
        assert_eq!(topo.runtime_isolated().to_string(), "3");
    }

    #[cfg(not(loom))]
    #[test]
    fn a_process_cpuset_is_its_cgroups_or_the_nearest_ancestors() {
        let files = |list: &'static [(&'static str, &'static str)]| {
            move |p: &Path| {
                list.iter()
                    .find(|(path, _)| Path::new(path) == p)
                    .map(|(_, text)| text.to_string())
            }
        };
        // v2: the cpuset controller is not enabled for the service's own cgroup.
        let v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
        let me = "0::/system.slice/svc.service\n";
        let read = files(&[("/sys/fs/cgroup/system.slice/cpuset.cpus.effective", "0-2\n")]);
        assert_eq!(cpuset_of(me, v2, read).unwrap().to_string(), "0-2");
        // v1, as this project's development VM has it.
        let v1 = "cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n\
                  cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
        let me = "5:cpuset:/\n0::/user.slice\n";
        let read = files(&[("/sys/fs/cgroup/cpuset/cpuset.effective_cpus", "0-1\n")]);
        assert_eq!(cpuset_of(me, v1, read).unwrap().to_string(), "0-1");
        // No cpuset anywhere.
        assert_eq!(cpuset_of(me, "proc /proc proc rw 0 0\n", files(&[])), None);
    }

    #[test]
    fn reads_this_machine() {
        let topo = Topology::read().unwrap();
        assert!(!topo.online().is_empty());
        assert!(topo.online().is_subset(topo.possible()));
    }
}
