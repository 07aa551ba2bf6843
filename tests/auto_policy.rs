//! The default policy is the kernel's rule (FIDELITY item 5; issue 12, point 3): with no
//! explicit policy, isolated and `nohz_full` CPUs are in remote mode and the others in queue
//! mode, and a machine without isolation is in queue mode everywhere; an explicit policy always
//! wins; `describe()` says which rule chose each CPU's mode. The isolation is faked with a
//! sysfs tree ([`FakeSysfs`]), so no real isolation is needed.

#![cfg(not(loom))]

use qpw_core::{CpuSet, CpuSpec, FakeSysfs, Mode, Policy, Qpw, Topology};

/// A fake sysfs over the allowed CPUs, with `isolated` and `nohz_full` lists as given.
fn fake(isolated: Option<&str>, nohz_full: Option<&str>) -> (tempfile::TempDir, CpuSet) {
    let allowed = qpw_core::allowed_cpus().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut tree = FakeSysfs::new(&allowed.to_string());
    if let Some(list) = isolated {
        tree = tree.isolated(list);
    }
    if let Some(list) = nohz_full {
        tree = tree.nohz_full(list);
    }
    tree.write(dir.path()).unwrap();
    (dir, allowed)
}

fn modes(qpw: &Qpw) -> (CpuSet, CpuSet) {
    (qpw.cpus_in(Mode::Queue), qpw.cpus_in(Mode::Remote))
}

#[test]
fn smoke_the_default_is_the_kernels_rule() {
    let qpw = Qpw::new().unwrap();
    assert_eq!(*qpw.policy(), Policy::Auto);
    assert_eq!(*Qpw::builder().build().unwrap().policy(), Policy::Auto);
    // On this machine, whatever its isolation: remote exactly on the isolated CPUs.
    let isolated = Topology::read().unwrap().isolated_or_nohz_full();
    for cpu in qpw.cpus().iter() {
        let expect = if isolated.contains(cpu) {
            Mode::Remote
        } else {
            Mode::Queue
        };
        assert_eq!(qpw.mode(cpu).unwrap(), expect, "cpu {cpu}");
    }
    assert!(
        qpw.describe()
            .contains("policy auto (the default: the kernel's rule)"),
        "{}",
        qpw.describe()
    );
}

#[test]
fn isolated_cpus_are_remote_by_default() {
    let allowed = qpw_core::allowed_cpus().unwrap();
    let last = allowed.last().unwrap();
    let (root, _) = fake(Some(&last.to_string()), Some("(null)"));
    let qpw = Qpw::builder().sysfs_root(root.path()).build().unwrap();
    let (queue, remote) = modes(&qpw);
    assert_eq!(remote, CpuSet::from_iter([last]));
    assert_eq!(queue, allowed.iter().filter(|&c| c != last).collect());
    let text = qpw.describe();
    assert!(
        text.contains(&format!("remote on {last} (isolated or nohz_full)")),
        "{text}"
    );
    if !queue.is_empty() {
        assert!(
            text.contains(&format!("queue on {queue} (housekeeping)")),
            "{text}"
        );
    }
}

#[test]
fn nohz_full_cpus_are_remote_by_default() {
    let allowed = qpw_core::allowed_cpus().unwrap();
    let first = allowed.first().unwrap();
    let (root, _) = fake(None, Some(&first.to_string()));
    let qpw = Qpw::builder().sysfs_root(root.path()).build().unwrap();
    assert_eq!(qpw.mode(first).unwrap(), Mode::Remote);
    assert_eq!(qpw.cpus_in(Mode::Remote), CpuSet::from_iter([first]));
}

#[test]
fn without_isolation_the_default_is_queue_everywhere() {
    for (isolated, nohz_full) in [(None, None), (Some(""), Some("(null)"))] {
        let (root, allowed) = fake(isolated, nohz_full);
        let qpw = Qpw::builder().sysfs_root(root.path()).build().unwrap();
        assert_eq!(modes(&qpw), (allowed.clone(), CpuSet::new()));
        let text = qpw.describe();
        assert!(
            text.contains(&format!(
                "queue on {allowed} (no isolated or nohz_full CPU), remote on (none)"
            )),
            "{text}"
        );
    }
}

#[test]
fn an_explicit_policy_always_wins() {
    let allowed = qpw_core::allowed_cpus().unwrap();
    let last = allowed.last().unwrap();
    let (root, _) = fake(Some(&last.to_string()), Some(&last.to_string()));
    let build = |policy: Policy| {
        Qpw::builder()
            .policy(policy)
            .sysfs_root(root.path())
            .build()
            .unwrap()
    };
    let qpw = build(Policy::Queue);
    assert_eq!(modes(&qpw), (allowed.clone(), CpuSet::new()));
    assert!(qpw.describe().contains(&format!(
        "policy queue (explicit): queue on {allowed} (every CPU)"
    )));
    let qpw = build(Policy::Remote);
    assert_eq!(modes(&qpw), (CpuSet::new(), allowed.clone()));
    let first = allowed.first().unwrap();
    let qpw = build(Policy::RemoteOn(CpuSet::from_iter([first])));
    assert_eq!(qpw.cpus_in(Mode::Remote), CpuSet::from_iter([first]));
    assert!(
        qpw.describe()
            .contains(&format!("remote on {first} (listed)")),
        "{}",
        qpw.describe()
    );
    // The rule itself, chosen explicitly, gives the same modes and says it was chosen.
    let qpw = build(Policy::Isolated);
    assert_eq!(qpw.cpus_in(Mode::Remote), CpuSet::from_iter([last]));
    assert!(qpw.describe().contains("policy isolated (explicit)"));
}

#[test]
fn logical_cpus_follow_their_physical_cpus_isolation_by_default() {
    let allowed = qpw_core::allowed_cpus().unwrap();
    let last = allowed.last().unwrap();
    let (root, _) = fake(Some(&last.to_string()), None);
    let n = 2 * allowed.len();
    let qpw = Qpw::builder()
        .cpus(CpuSpec::Logical(n))
        .sysfs_root(root.path())
        .build()
        .unwrap();
    for cpu in 0..n {
        let on_last = qpw.physical_cpu(cpu).unwrap() == last;
        let expect = if on_last { Mode::Remote } else { Mode::Queue };
        assert_eq!(qpw.mode(cpu).unwrap(), expect, "logical cpu {cpu}");
    }
}

#[test]
fn auto_is_a_policy_name() {
    assert_eq!("auto".parse::<Policy>().unwrap(), Policy::Auto);
    assert_eq!(Policy::Auto.to_string(), "auto");
    assert_eq!(Policy::default(), Policy::Auto);
    assert!(!Policy::Auto.is_explicit() && Policy::Queue.is_explicit());
}

/// CPUs isolated at run time (a cgroup v2 isolated partition: `cpuset.cpus.isolated`) are
/// remote by default too (issue 22's last point).
#[test]
fn run_time_isolated_cpus_are_remote_by_default() {
    let allowed = qpw_core::allowed_cpus().unwrap();
    let last = allowed.iter().last().unwrap();
    let dir = tempfile::tempdir().unwrap();
    FakeSysfs::new(&allowed.to_string())
        .runtime_isolated(&last.to_string())
        .write(dir.path())
        .unwrap();
    let qpw = Qpw::builder().sysfs_root(dir.path()).build().unwrap();
    assert_eq!(qpw.mode(last).unwrap(), Mode::Remote, "{}", qpw.describe());
    for cpu in allowed.iter().filter(|&c| c != last) {
        assert_eq!(qpw.mode(cpu).unwrap(), Mode::Queue, "{}", qpw.describe());
    }
}

/// `Builder::isolated` declares isolated CPUs the kernel does not report: the default policy
/// (and `isolated`) puts them in remote mode; an explicit policy still wins (issue 26, point 5).
#[test]
fn declared_isolated_cpus_are_remote_under_the_default_policy() {
    let (dir, allowed) = fake(None, None);
    let last = allowed.iter().last().unwrap();
    let declared = CpuSet::from_iter([last]);
    for policy in [Policy::Auto, Policy::Isolated] {
        let qpw = Qpw::builder()
            .sysfs_root(dir.path())
            .policy(policy.clone())
            .isolated(declared.clone())
            .build()
            .unwrap();
        assert_eq!(modes(&qpw).1, declared, "{policy:?}: {}", qpw.describe());
        assert!(qpw.isolated().contains(last));
    }
    let queue = Qpw::builder()
        .sysfs_root(dir.path())
        .policy(Policy::Queue)
        .isolated(declared)
        .build()
        .unwrap();
    assert!(modes(&queue).1.is_empty(), "an explicit policy wins");
}
