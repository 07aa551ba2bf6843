//! The pin hook (`qpw_core::set_pin_hook`): it runs before qpw gives any thread CPUs, the
//! framework's own workers included, with that thread's id, so that a program whose isolated
//! CPUs sit in a cgroup v2 threaded partition can move each thread into the partition first
//! (a thread outside it cannot be given its CPUs). One test per binary: the hook is the
//! process's.

#![cfg(not(loom))]

use std::sync::{Arc, Mutex};

use qpw_core::{CpuSet, Policy, Qpw};

#[test]
fn the_hook_sees_every_worker_by_its_thread_id_and_can_refuse() {
    let seen: Arc<Mutex<Vec<(i32, CpuSet)>>> = Arc::default();
    let record = seen.clone();
    qpw_core::set_pin_hook(Some(Box::new(move |tid, cpus| {
        record.lock().unwrap().push((tid, cpus.clone()));
        Ok(())
    })));
    let qpw = Qpw::with_policy(Policy::Queue).unwrap();
    let cpus = qpw.cpus().clone();
    let work = qpw.work(|_| {}).unwrap();
    // A drain on every CPU starts every CPU's worker.
    assert!(work.drain_all(|_| true).is_complete());
    let seen = seen.lock().unwrap().clone();
    for cpu in cpus.iter() {
        let (tid, asked) = seen
            .iter()
            .find(|(_, c)| *c == CpuSet::from_iter([cpu]))
            .unwrap_or_else(|| panic!("no hook call for cpu {cpu}'s worker: {seen:?}"));
        // The id is the worker's own: its name is qpw/<cpu>.
        let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap();
        assert_eq!(comm.trim(), format!("qpw/{cpu}"), "{asked}");
    }
    drop(work);
    drop(qpw);

    // A hook that refuses fails the pinning, with its reason.
    qpw_core::set_pin_hook(Some(Box::new(|_, _| {
        Err(std::io::Error::other("not in the partition"))
    })));
    let cpu = qpw_core::allowed_cpus().unwrap().first().unwrap();
    let e = qpw_core::pin_current_thread(cpu).unwrap_err().to_string();
    assert!(e.contains("not in the partition"), "{e}");
    qpw_core::set_pin_hook(None);
    qpw_core::pin_current_thread(cpu).unwrap();
}
