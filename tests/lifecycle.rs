//! qpw-core at its edges (issue 13): shutdown, deadlines, re-entrant work, panics, drop order
//! and bad input. One test per case, each run under a watchdog where the old behaviour hung.

#![cfg(not(loom))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use qpw_core::{CpuSet, CpuSpec, Error, PerCpuWork, Policy, Qpw};
use qpw_tests::{within, Gate};

/// Long enough never to fire on a healthy run of this VM, short enough for CI.
const WATCHDOG: Duration = Duration::from_secs(60);

fn logical(n: usize, policy: Policy) -> Qpw {
    Qpw::builder()
        .cpus(CpuSpec::Logical(n))
        .policy(policy)
        .build()
        .unwrap()
}

fn counting_work(qpw: &Qpw) -> (PerCpuWork, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let work = qpw
        .work(move |_| {
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    (work, runs)
}

/// Case 1: after `shutdown` (or the drop of the last handle), remote-mode work is refused
/// like queue-mode work, in `queue_on` and in `drain_all`, and does not run.
#[test]
fn case01_remote_work_after_shutdown_is_refused() {
    let qpw = logical(2, Policy::Remote);
    let (work, runs) = counting_work(&qpw);
    assert!(work.queue_on(1).unwrap());
    let _ = qpw.shutdown();
    assert!(qpw.is_shut_down());
    let err = work.queue_on(1).unwrap_err();
    assert_eq!(err, Error::ShutDown { cpu: 1 });
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // The same after the last handle is dropped.
    let qpw = logical(2, Policy::Remote);
    let (work, runs) = counting_work(&qpw);
    let other = qpw.clone();
    drop(qpw);
    assert!(work.queue_on(0).unwrap(), "a handle is still alive");
    drop(other);
    assert_eq!(work.queue_on(0), Err(Error::ShutDown { cpu: 0 }));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A mixed instance: every CPU refused, none run.
    let qpw = logical(2, Policy::RemoteOn("1".parse().unwrap()));
    let (work, runs) = counting_work(&qpw);
    let _ = qpw.shutdown();
    let report = work.drain_all(|_| true);
    assert!(report.ran_remote.is_empty(), "{report:?}");
    assert_eq!(report.errors.len(), 2, "{report:?}");
    assert_eq!(
        report.errors,
        [Error::ShutDown { cpu: 0 }, Error::ShutDown { cpu: 1 }]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Case 2: `drain_all_timeout` keeps its one deadline in remote mode when the target CPU's lock
/// is held, by another thread or by the caller itself: it returns with a stall for that CPU
/// (the holder lets go only after the drain has returned, so an unkept deadline hangs).
#[test]
fn case02_remote_drain_keeps_its_deadline() {
    within(WATCHDOG, "case02", || {
        let qpw = Arc::new(logical(2, Policy::Remote));
        let stock = qpw.per_cpu(|_| 5u32);
        let s = stock.clone();
        let drain = qpw
            .work(move |ctx| {
                if let Ok(mut n) = s.lock_work(ctx) {
                    *n = 0;
                }
            })
            .unwrap();

        // Another thread of cpu 1 holds its lock until the drain has returned.
        let (gate, held) = (Gate::new(), Gate::new());
        let holder = {
            let (qpw, stock, gate, held) = (qpw.clone(), stock.clone(), gate.clone(), held.clone());
            thread::spawn(move || {
                let _bound = qpw.bind_current(1).unwrap();
                let _guard = stock.lock_local().unwrap();
                held.open();
                gate.wait();
            })
        };
        held.wait();
        let report = drain.drain_all_timeout(|_| true, Duration::from_millis(150));
        gate.open();
        holder.join().unwrap();
        assert_eq!(report.ran_remote.to_string(), "0-1");
        assert!(
            matches!(report.errors[..], [Error::LockStall { cpu: 1, waited, timeout }]
                if waited >= timeout && timeout == Duration::from_millis(150)),
            "{report:?}"
        );
        assert!(report.errors[0].is_stall());
        let mut left = Vec::new();
        stock.read_each(|cpu, n| left.push((cpu, *n)));
        assert_eq!(left, [(0, 0), (1, 5)], "cpu 1's run gave up");

        // The caller itself holds it: refused at once (issue 24; in release builds too since
        // issue 31, `lock` being a requester's call).
        let guard = stock.lock(1).unwrap();
        let report = drain.drain_all_timeout(|cpu| cpu == 1, Duration::from_millis(100));
        drop(guard);
        assert_self_wait_ended(&report);
        // Without the holder, the same drain completes.
        assert!(drain
            .drain_all_timeout(|_| true, Duration::from_secs(30))
            .is_complete());
    });
}

/// Case 3: work that flushes its own CPU (itself, or another item queued to the same CPU) is
/// refused with a clear error instead of deadlocking the worker; the same for owner-only work
/// flushed from the owner's poll. The instance then drops cleanly.
#[test]
fn case03_work_that_flushes_its_own_cpu_is_refused() {
    within(WATCHDOG, "case03", || {
        let qpw = logical(1, Policy::Queue);
        let me: Arc<OnceLock<PerCpuWork>> = Arc::new(OnceLock::new());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (m, s) = (me.clone(), seen.clone());
        let work = qpw
            .work(move |ctx| {
                let outcome = m.get().unwrap().flush(ctx.cpu());
                s.lock().unwrap().push(outcome.map_err(|e| e.to_string()));
            })
            .unwrap();
        let work = me.get_or_init(|| work);
        work.queue_on(0).unwrap();
        work.flush(0).unwrap();
        let outcome = seen.lock().unwrap().pop().unwrap();
        assert_eq!(outcome, Err(Error::SelfFlush { cpu: 0 }.to_string()));

        // Another item, queued to the same CPU by the running one, then flushed.
        let other = qpw.work(|_| ()).unwrap();
        let (o, s) = (other.clone(), seen.clone());
        let outer = qpw
            .work(move |ctx| {
                o.queue_on(ctx.cpu()).unwrap();
                let outcome = o.flush(ctx.cpu());
                s.lock().unwrap().push(outcome.map_err(|e| e.to_string()));
            })
            .unwrap();
        outer.queue_on(0).unwrap();
        outer.flush(0).unwrap();
        other.flush(0).unwrap(); // ran after `outer` returned
        let outcome = seen.lock().unwrap().pop().unwrap();
        assert_eq!(outcome, Err(Error::SelfFlush { cpu: 0 }.to_string()));
        drop(qpw);
    });
}

/// Case 3, owner-only: an item that flushes itself from the owner's poll is refused too.
#[test]
fn case03_owner_work_that_flushes_itself_is_refused() {
    within(WATCHDOG, "case03-owner", || {
        let qpw = logical(1, Policy::Queue);
        let slots = qpw.owned_per_cpu(|_| 0u32).unwrap();
        let me: Arc<OnceLock<PerCpuWork>> = Arc::new(OnceLock::new());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (m, s) = (me.clone(), seen.clone());
        let first = Arc::new(AtomicUsize::new(1));
        let work = slots
            .work(move |ctx| {
                if first.swap(0, Ordering::SeqCst) == 1 {
                    let me = m.get().unwrap();
                    me.queue_on(ctx.cpu()).unwrap(); // pending again: a flush would wait for it
                    s.lock().unwrap().push(me.flush(ctx.cpu()));
                }
            })
            .unwrap();
        let work = me.get_or_init(|| work);
        let mut owner = slots.claim(0).unwrap();
        work.queue_on(0).unwrap();
        assert_eq!(owner.poll(), 2, "the re-queued run ran in the same poll");
        assert_eq!(*seen.lock().unwrap(), [Err(Error::SelfFlush { cpu: 0 })]);
        work.flush(0).unwrap();
        // The same owner, outside a poll, with a run pending: it would wait for itself too.
        work.queue_on(0).unwrap();
        assert_eq!(work.flush(0), Err(Error::SelfFlush { cpu: 0 }));
        assert_eq!(owner.poll(), 1);
        work.flush(0).unwrap();
        drop(owner);
        drop(qpw);
    });
}

/// Case 4: a panic of remote-mode work is reported by the call it happened in (`queue_on`
/// here), and not again by a later, clean drain.
#[test]
fn case04_a_remote_panic_belongs_to_its_call() {
    let qpw = logical(2, Policy::Remote);
    let armed = Arc::new(AtomicUsize::new(1));
    let a = armed.clone();
    let work = qpw
        .work(move |ctx| {
            if a.swap(0, Ordering::SeqCst) == 1 {
                panic!("boom on cpu {}", ctx.cpu());
            }
        })
        .unwrap();
    let err = work.queue_on(1).unwrap_err();
    assert_eq!(
        err,
        Error::WorkPanicked {
            cpu: 1,
            message: "boom on cpu 1".into(),
            runs: 1
        }
    );
    let report = work.drain_all(|_| true);
    assert!(report.is_complete(), "{:?}", report.errors);

    // A panic in a drain's remote run is that drain's, once.
    armed.store(1, Ordering::SeqCst);
    let report = work.drain_all(|_| true);
    assert_eq!(report.ran_remote.to_string(), "0-1");
    assert!(
        matches!(
            &report.errors[..],
            [Error::WorkPanicked {
                cpu: 0,
                runs: 1,
                ..
            }]
        ),
        "{report:?}"
    );
    assert!(work.drain_all(|_| true).is_complete());
}

/// Case 5: dropping the instance while holding a guard that queued work needs returns; the
/// work runs once the guard is released.
#[test]
fn case05_dropping_the_instance_while_holding_a_guard() {
    within(WATCHDOG, "case05", || {
        let qpw = logical(1, Policy::Queue);
        let stock = qpw.per_cpu(|_| 5u32);
        let s = stock.clone();
        let drain = qpw.work(move |ctx| *s.lock_work(ctx).unwrap() = 0).unwrap();
        let bound = qpw.bind_current(0).unwrap();
        let guard = stock.lock_local().unwrap();
        drain.queue_on(0).unwrap();
        drop(qpw);
        assert_eq!(*guard, 5, "the drop returned before the run");
        assert_eq!(drain.queue_on(0), Err(Error::ShutDown { cpu: 0 }));
        drop(guard);
        drain.flush(0).unwrap();
        assert_eq!(*stock.lock_local().unwrap(), 0);
        drop(bound);
    });
}

/// Case 6: the last handle of the instance dropped on one of its own workers: no panic, the
/// run completes.
#[test]
fn case06_dropping_the_last_handle_on_its_own_worker() {
    within(WATCHDOG, "case06", || {
        let holder: Arc<Mutex<Option<Qpw>>> = Arc::new(Mutex::new(None));
        let qpw = logical(1, Policy::Queue);
        let h = holder.clone();
        let work = qpw.work(move |_| drop(h.lock().unwrap().take())).unwrap();
        *holder.lock().unwrap() = Some(qpw);
        work.queue_on(0).unwrap();
        assert_eq!(work.flush(0), Ok(()), "the drop did not panic");
        assert!(holder.lock().unwrap().is_none());
        assert_eq!(work.queue_on(0), Err(Error::ShutDown { cpu: 0 }));

        // An explicit shutdown from the worker: it does not wait for itself either.
        let qpw = logical(2, Policy::Queue);
        let seen = Arc::new(Mutex::new(None));
        let (q, s) = (qpw.clone(), seen.clone());
        let work = qpw
            .work(move |_| *s.lock().unwrap() = Some(q.shutdown()))
            .unwrap();
        work.queue_on(1).unwrap();
        assert_eq!(work.flush(1), Ok(()));
        let report = seen.lock().unwrap().take().unwrap();
        assert_eq!(report.ran, 0, "{report:?}");
        assert!(qpw.is_shut_down());
    });
}

/// Case 8: bindings dropped out of order leave the thread as it was before the first.
#[test]
fn case08_bindings_dropped_out_of_order() {
    let qpw = logical(2, Policy::Queue);
    let before = qpw_core::current_affinity().unwrap();
    let b0 = qpw.bind_current(0).unwrap();
    let b1 = qpw.bind_current(1).unwrap();
    drop(b0);
    assert_eq!(qpw.current_cpu(), Some(1), "the newest binding still holds");
    drop(b1);
    assert_eq!(qpw.current_cpu(), None);
    assert_eq!(qpw_core::current_affinity().unwrap(), before);
}

/// Case 8, owner claims: two claims by one thread given up out of order.
#[test]
fn case08_owner_claims_dropped_out_of_order() {
    let qpw = logical(2, Policy::Queue);
    let before = qpw_core::current_affinity().unwrap();
    let slots = qpw.owned_per_cpu(|_| 0u32).unwrap();
    let o0 = slots.claim(0).unwrap();
    let o1 = slots.claim(1).unwrap();
    drop(o0);
    assert_eq!(qpw.current_cpu(), Some(1));
    drop(o1);
    assert_eq!(qpw.current_cpu(), None);
    assert_eq!(qpw_core::current_affinity().unwrap(), before);
}

/// Case 9: a `remote:<list>` policy naming CPUs the instance does not manage is refused.
#[test]
fn case09_remote_on_an_unmanaged_cpu_is_refused() {
    let err = Qpw::builder()
        .cpus(CpuSpec::Logical(2))
        .policy(Policy::RemoteOn("1,7".parse().unwrap()))
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "policy `remote:1,7` names cpu 7, which is not in the managed set 0-1: list only \
         managed CPUs"
    );
    assert!(matches!(err, Error::PolicyCpuNotManaged { cpu: 7, .. }));
}

/// Case 10: a sysfs root is read only by the policies that need the topology.
#[test]
fn case10_sysfs_root_is_read_only_when_needed() {
    let missing = std::env::temp_dir().join("qpw-no-such-sysfs-root");
    for policy in [
        Policy::Queue,
        Policy::Remote,
        Policy::RemoteOn(CpuSet::new()),
    ] {
        Qpw::builder()
            .cpus(CpuSpec::Logical(2))
            .policy(policy.clone())
            .sysfs_root(&missing)
            .build()
            .unwrap_or_else(|e| panic!("{policy}: {e}"));
    }
}

/// Case 10: `WorkCtx::is_remote` and `Qpw::is_cpu_remote` give the same answer inside a run.
#[test]
fn case10_is_remote_agrees_with_is_cpu_remote() {
    let qpw = logical(2, Policy::Remote);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (q, s) = (qpw.clone(), seen.clone());
    let work = qpw
        .work(move |ctx| {
            let other = q.is_cpu_remote(ctx.cpu()).unwrap();
            assert!(!ctx.is_queued(), "both runs happen in the caller");
            s.lock().unwrap().push((ctx.is_remote(), other));
        })
        .unwrap();
    work.queue_on(1).unwrap(); // an unbound caller: remote
    {
        let _bound = qpw.bind_current(1).unwrap();
        work.queue_on(1).unwrap(); // a thread of cpu 1: not remote
    }
    let seen = seen.lock().unwrap();
    assert_eq!(*seen, [(true, true), (false, false)]);
}

/// Case 10: re-locking the same CPU inside remote work is refused at once (issue 24), in every
/// build (issue 31). A hold through the owner's path, which release builds do not record, is
/// waited for until the deadline there instead: `tests/reentrant.rs` checks that case.
#[test]
fn case10_relocking_inside_remote_work_is_refused() {
    within(WATCHDOG, "case10-relock", || {
        let qpw = logical(2, Policy::Remote);
        let stock = qpw.per_cpu(|_| 0u32);
        let s = stock.clone();
        let work = qpw
            .work(move |ctx| {
                let _first = s.lock_work(ctx).unwrap();
                assert!(s.lock_work(ctx).is_err());
            })
            .unwrap();
        let report = work.drain_all_timeout(|cpu| cpu == 1, Duration::from_millis(100));
        assert_self_wait_ended(&report);
    });
}

/// Case 10: `is_cpu_remote` of a CPU the instance does not manage is an error, not `false`.
#[test]
fn case10_is_cpu_remote_of_an_unmanaged_cpu_is_an_error() {
    let qpw = logical(2, Policy::Remote);
    assert_eq!(qpw.is_cpu_remote(1), Ok(true));
    assert_eq!(
        qpw.is_cpu_remote(99),
        Err(Error::CpuNotManaged {
            cpu: 99,
            managed: "0-1".parse().unwrap()
        })
    );
}

/// Case 10: `lock_local` from a thread running on a CPU the instance does not manage says
/// that it is the caller's CPU.
#[test]
fn case10_lock_local_from_an_unmanaged_cpu_names_the_caller() {
    let allowed = qpw_core::allowed_cpus().unwrap();
    if allowed.len() < 2 {
        eprintln!("one CPU allowed: no unmanaged CPU to run on; nothing to test");
        return;
    }
    let (managed, other) = (allowed.as_slice()[0], allowed.as_slice()[1]);
    let qpw = Qpw::builder()
        .cpus(CpuSpec::List(CpuSet::from_iter([managed])))
        .policy(Policy::Queue)
        .build()
        .unwrap();
    let stock = qpw.per_cpu(|_| 0u32);
    let text = thread::scope(|scope| {
        scope
            .spawn(|| {
                qpw_core::pin_current_thread(other).unwrap();
                stock.lock_local().unwrap_err().to_string()
            })
            .join()
            .unwrap()
    });
    assert_eq!(
        text,
        Error::CallerNotManaged {
            cpu: other,
            managed: CpuSet::from_iter([managed])
        }
        .to_string()
    );
    assert!(
        text.starts_with(&format!("the calling thread runs on cpu {other}")),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// Ergonomics noticed on the way (issue 13).
// ---------------------------------------------------------------------------------------------

/// `Qpw`, `PerCpu` and `PerCpuWork` are cheap handles; a shutdown needs no `Arc::try_unwrap`.
#[test]
fn handles_clone_and_shut_down_from_any_clone() {
    let qpw = logical(2, Policy::Queue);
    let shared = Arc::new(qpw.clone());
    let state = qpw.per_cpu(|_| 1u32);
    let s = state.clone();
    let drain = qpw.work(move |ctx| *s.lock_work(ctx).unwrap() = 0).unwrap();
    let again = drain.clone();
    again.queue_on(1).unwrap();
    drain.flush(1).unwrap();
    let report = shared.shutdown();
    assert_eq!(report.ran, 0);
    assert!(qpw.is_shut_down());
    let mut left = Vec::new();
    state.read_each(|cpu, n| left.push((cpu, *n)));
    assert_eq!(left, [(0, 1), (1, 0)]);
    // A second shutdown finds nothing to stop.
    assert_eq!(qpw.shutdown(), qpw_core::ShutdownReport::default());
}

/// `Error` is `Clone` and `PartialEq`, the system's errors included; `PerCpu` is `Debug`
/// whatever its `T`.
#[test]
fn errors_compare_and_per_cpu_debugs_without_t_debug() {
    let allowed = qpw_core::allowed_cpus().unwrap();
    let outside = (0..1000).find(|&c| !allowed.contains(c)).unwrap();
    let err = qpw_core::pin_current_thread(outside).unwrap_err();
    assert_eq!(err.clone(), err);
    let os = qpw_core::set_current_fifo(0).unwrap_err();
    assert_eq!(os.clone(), os);
    assert_ne!(os, err);

    struct Opaque;
    let qpw = logical(2, Policy::Queue);
    let state = qpw.per_cpu(|_| Opaque);
    assert!(format!("{state:?}").starts_with("PerCpu"));
}

/// The state of the cheaper local paths can be read for a final sum without tearing the
/// instance down: `RseqLock` slots through the fenced path, owner-only slots while no other
/// thread owns them.
#[test]
fn read_each_sums_rseq_and_owner_only_state() {
    let qpw = Qpw::builder().policy(Policy::Queue).build().unwrap();
    let state = qpw.per_cpu_with::<qpw_core::RseqLock, _>(|_| 0u64).unwrap();
    let mut expect = 0;
    for cpu in qpw.cpus().iter() {
        let _bound = qpw.bind_current(cpu).unwrap();
        *state.lock_local().unwrap() += cpu as u64 + 1;
        expect += cpu as u64 + 1;
    }
    let mut total = 0;
    state.read_each(|_, n| total += *n);
    assert_eq!(total, expect);

    let qpw = logical(2, Policy::Queue);
    let owned = qpw.owned_per_cpu(|cpu| cpu as u64 * 10).unwrap();
    let (claimed, release) = (Gate::new(), Gate::new());
    let owner = {
        let (owned, claimed, release) = (owned.clone(), claimed.clone(), release.clone());
        thread::spawn(move || {
            let mut owner = owned.claim(1).unwrap();
            *owner.lock_local().unwrap() += 5;
            claimed.open();
            release.wait();
        })
    };
    claimed.wait();
    let err = owned
        .read_each(|_, _| panic!("nothing is read"))
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyOwned { cpu: 1, .. }), "{err}");
    release.open();
    owner.join().unwrap();
    let mut seen = Vec::new();
    owned.read_each(|cpu, n| seen.push((cpu, *n))).unwrap();
    assert_eq!(seen, [(0, 0), (1, 15)]);
    // The slots are free again: a claim succeeds.
    drop(owned.claim(0).unwrap());
}

// ---------------------------------------------------------------------------------------------
// The lifecycle under random interleavings, across the policies.
// ---------------------------------------------------------------------------------------------

/// Rounds per policy, and operations per actor thread per round.
const ROUNDS: u64 = if cfg!(debug_assertions) { 40 } else { 100 };
const OPS: usize = 300;
const ACTORS: usize = 3;
/// The payload of the planned panics, which the quiet hook below does not print.
const FLAKY: &str = "flaky run";

/// xorshift64*: a seeded, reproducible stream (the seed is in every failure message).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

thread_local! {
    /// Planned panics that happened on this thread (in remote runs, and on workers).
    static PANICKED_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn panicked_here() -> u64 {
    PANICKED_HERE.with(|p| p.get())
}

/// Keeps the planned panics out of the test output; every other panic is printed as usual.
fn quiet_planned_panics() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&FLAKY) {
                previous(info);
            }
        }));
    });
}

/// One work item of the stress, with what its runs did and what its callers were told.
struct Item {
    work: PerCpuWork,
    runs: Arc<AtomicUsize>,
    panics: Arc<AtomicUsize>,
    /// Runs the callers were promised: fresh posts and remote runs (panicked or not).
    accepted: AtomicUsize,
}

/// What the stress needs from a policy: the instance, a work item that moves a CPU's count
/// into `sink`, and a way for a thread to add to its CPU's count (`None` for owner-only
/// state, whose owners add instead).
struct World {
    /// The main thread's handle, until it gives it to the actors.
    qpw: Option<Qpw>,
    cpus: CpuSet,
    items: Vec<Item>,
    sink: Arc<AtomicUsize>,
    added: Arc<AtomicUsize>,
    /// Adds 1 to `cpu`'s count from the calling thread, bound there with `handle`, which is
    /// dropped while the guard is held when told to (maybe the last handle: case 5) and
    /// given back otherwise.
    add: Option<AddFn>,
    /// The count left in the slots, once everything has stopped.
    left: Box<dyn Fn() -> usize + Send + Sync>,
    /// Owner threads, for owner-only state: stopped and joined at the end.
    owners: Option<Owners>,
    /// Runs of the short-lived items, and the runs their callers were promised.
    temp_runs: Arc<AtomicUsize>,
    temp_accepted: AtomicUsize,
}

type AddFn = Box<dyn Fn(Qpw, usize, bool) -> Option<Qpw> + Send + Sync>;

struct Owners {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

/// A work function over any per-CPU state: `take(ctx)` moves the CPU's count out (or `None`
/// if the run could not reach it); the flaky one panics on every third run.
fn item_fn(
    take: impl Fn(&qpw_core::WorkCtx) -> Option<usize> + Send + Sync + 'static,
    sink: &Arc<AtomicUsize>,
    flaky: bool,
) -> (
    impl Fn(&qpw_core::WorkCtx) + Send + Sync + 'static,
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
) {
    let (runs, panics) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (r, p, s) = (runs.clone(), panics.clone(), sink.clone());
    let func = move |ctx: &qpw_core::WorkCtx| {
        let n = r.fetch_add(1, Ordering::SeqCst);
        if let Some(moved) = take(ctx) {
            s.fetch_add(moved, Ordering::SeqCst);
        }
        if flaky && n % 3 == 0 {
            p.fetch_add(1, Ordering::SeqCst);
            PANICKED_HERE.with(|c| c.set(c.get() + 1));
            std::panic::panic_any(FLAKY);
        }
    };
    (func, runs, panics)
}

fn item(work: PerCpuWork, runs: Arc<AtomicUsize>, panics: Arc<AtomicUsize>) -> Item {
    Item {
        work,
        runs,
        panics,
        accepted: AtomicUsize::new(0),
    }
}

/// A world whose state is a `PerCpu` with lock `L`; with `on_cpu`, a third item made by
/// `work_on_cpu` (queued even on remote-mode CPUs).
fn locked_world<L: qpw_core::RawLocalLock + 'static>(qpw: Qpw, on_cpu: bool) -> World {
    let state = qpw.per_cpu_with::<L, _>(|_| 0usize).unwrap();
    let sink = Arc::new(AtomicUsize::new(0));
    let mut items = Vec::new();
    for (flaky, pinned) in [(false, false), (true, false), (true, true)] {
        if pinned && !on_cpu {
            continue;
        }
        let s = state.clone();
        let take = move |ctx: &qpw_core::WorkCtx| {
            let mut n = s.lock_work(ctx).ok()?;
            Some(std::mem::take(&mut *n))
        };
        let (func, runs, panics) = item_fn(take, &sink, flaky);
        let work = if pinned {
            qpw.work_on_cpu(func)
        } else {
            qpw.work(func)
        };
        items.push(item(work.unwrap(), runs, panics));
    }
    let added = Arc::new(AtomicUsize::new(0));
    let (s, a) = (state.clone(), added.clone());
    let add: AddFn = Box::new(move |qpw: Qpw, cpu, drop_it| {
        let _bound = qpw.bind_current(cpu).unwrap();
        let mut guard = s.lock_local().unwrap();
        *guard += 1;
        a.fetch_add(1, Ordering::SeqCst);
        let kept = (!drop_it).then_some(qpw); // else dropped with the guard held
        drop(guard);
        kept
    });
    let left = move || {
        let mut left = 0;
        state.read_each(|_, n| left += *n);
        left
    };
    World {
        cpus: qpw.cpus().clone(),
        qpw: Some(qpw),
        items,
        sink,
        added,
        add: Some(add),
        left: Box::new(left),
        owners: None,
        temp_runs: Arc::default(),
        temp_accepted: AtomicUsize::new(0),
    }
}

/// A world of owner-only state, with an owner thread polling (and adding) on every CPU.
fn owned_world(qpw: Qpw, seed: u64) -> World {
    let state = qpw.owned_per_cpu(|_| 0usize).unwrap();
    let sink = Arc::new(AtomicUsize::new(0));
    let mut items = Vec::new();
    for flaky in [false, true] {
        let s = state.clone();
        let take = move |ctx: &qpw_core::WorkCtx| {
            let mut n = s.lock_work(ctx).ok()?;
            Some(std::mem::take(&mut *n))
        };
        let (func, runs, panics) = item_fn(take, &sink, flaky);
        items.push(item(state.work(func).unwrap(), runs, panics));
    }
    let added = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let threads = qpw
        .cpus()
        .iter()
        .map(|cpu| {
            let (state, added, stop) = (state.clone(), added.clone(), stop.clone());
            thread::spawn(move || {
                let mut rng = Rng::new(seed ^ cpu as u64);
                let mut owner = state.claim(cpu).unwrap();
                while !stop.load(Ordering::SeqCst) {
                    if rng.below(4) == 0 {
                        owner.poll();
                    }
                    *owner.lock_local().unwrap() += 1;
                    added.fetch_add(1, Ordering::SeqCst);
                    thread::yield_now();
                }
                owner.poll();
            })
        })
        .collect();
    let left = move || {
        let mut left = 0;
        state.read_each(|_, n| left += *n).unwrap();
        left
    };
    World {
        cpus: qpw.cpus().clone(),
        qpw: Some(qpw),
        items,
        sink,
        added,
        add: None,
        left: Box::new(left),
        owners: Some(Owners { stop, threads }),
        temp_runs: Arc::default(),
        temp_accepted: AtomicUsize::new(0),
    }
}

/// Adds a reported panic count to `reported`; anything but a planned panic or a refusal is a
/// failure.
fn tally(error: &Error, reported: &AtomicUsize, what: &str) {
    match error {
        Error::WorkPanicked { message, runs, .. } if message == FLAKY => {
            reported.fetch_add(*runs, Ordering::SeqCst);
        }
        Error::ShutDown { .. } => {}
        other => panic!("{what}: unexpected error {other}"),
    }
}

/// One actor's random walk over the world.
fn actor(world: &World, mut handles: Vec<Qpw>, seed: u64, reported: &AtomicUsize) {
    let mut rng = Rng::new(seed);
    let cpus: Vec<usize> = world.cpus.iter().collect();
    for op in 0..OPS {
        let what = format!("seed {seed}, op {op}");
        let it = &world.items[rng.below(world.items.len() as u64) as usize];
        let cpu = cpus[rng.below(cpus.len() as u64) as usize];
        let before = panicked_here();
        match rng.below(100) {
            // queue_on: a remote run's panic is this call's, and only a remote run's.
            0..=29 => {
                let remote = !it.work.is_queued(cpu).unwrap();
                let outcome = it.work.queue_on(cpu);
                let here = panicked_here() - before;
                match &outcome {
                    Ok(true) | Err(Error::WorkPanicked { .. }) => {
                        it.accepted.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(false) | Err(Error::ShutDown { .. }) => {}
                    Err(other) => panic!("{what}: queue_on: {other}"),
                }
                if let Err(e) = &outcome {
                    tally(e, reported, &what);
                }
                let expect =
                    u64::from(remote && matches!(outcome, Err(Error::WorkPanicked { .. })));
                assert_eq!(
                    here, expect,
                    "{what}: queue_on ({outcome:?}) and this thread's panics"
                );
            }
            30..=49 => {
                if let Err(e) = it.work.flush(cpu) {
                    tally(&e, reported, &what);
                }
            }
            // drain_all: the remote runs' panics are this drain's.
            50..=64 => {
                let report = if rng.below(2) == 0 {
                    it.work.drain_all(|_| true)
                } else {
                    it.work
                        .drain_all_timeout(|c| c != cpu, Duration::from_secs(30))
                };
                let fresh = report
                    .queued
                    .iter()
                    .filter(|&c| !report.coalesced.contains(c));
                let runs = fresh.count() + report.ran_remote.len();
                it.accepted.fetch_add(runs, Ordering::SeqCst);
                let mut remote_panics = 0;
                for e in &report.errors {
                    tally(e, reported, &what);
                    if let Error::WorkPanicked { cpu, runs, .. } = e {
                        if report.ran_remote.contains(*cpu) {
                            remote_panics += *runs as u64;
                        }
                    }
                }
                assert_eq!(
                    panicked_here() - before,
                    remote_panics,
                    "{what}: {report:?} and this thread's panics"
                );
            }
            // A guard taken and dropped, maybe with a handle dropped under it.
            65..=79 => {
                if let (Some(add), Some(qpw)) = (&world.add, handles.pop()) {
                    handles.extend(add(qpw, cpu, rng.below(4) == 0));
                }
            }
            // Handles cloned and dropped.
            80..=91 => {
                if rng.below(2) == 0 {
                    if let Some(h) = handles.last().cloned() {
                        handles.push(h);
                    }
                } else {
                    handles.pop();
                }
            }
            // A short-lived item, queued and dropped without a flush: its run still happens.
            92..=97 => {
                let runs = world.temp_runs.clone();
                let temp = handles.last().map(|h| {
                    h.work(move |_| {
                        runs.fetch_add(1, Ordering::SeqCst);
                    })
                });
                if let Some(Ok(temp)) = temp {
                    match temp.queue_on(cpu) {
                        Ok(true) => {
                            world.temp_accepted.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(Error::ShutDown { .. }) => {}
                        other => panic!("{what}: a fresh item's queue_on: {other:?}"),
                    }
                }
            }
            // A shutdown, now and then.
            _ => {
                if rng.below(8) == 0 {
                    if let Some(h) = handles.last() {
                        let report = h.shutdown();
                        reported.fetch_add(report.panicked.len(), Ordering::SeqCst);
                    }
                }
            }
        }
    }
}

/// One round: actors walk the world; the main thread then stops the instance (shutdown or the
/// drop of its last handle), flushes every item, and checks the books. Returns the runs, the
/// panics and the units added, for the summary.
fn round(mut world: World, seed: u64) -> [usize; 3] {
    let reported = Arc::new(AtomicUsize::new(0));
    // The main thread keeps a handle in half the rounds; in the others the actors hold the
    // only ones, and the last actor to drop its own stops the instance.
    let main = world.qpw.take().unwrap();
    let handles: Vec<Qpw> = (0..ACTORS).map(|_| main.clone()).collect();
    let main = seed.is_multiple_of(2).then_some(main);
    let world = Arc::new(world);
    let actors: Vec<_> = handles
        .into_iter()
        .zip(0..)
        .map(|(handle, a)| {
            let (world, reported) = (world.clone(), reported.clone());
            thread::spawn(move || actor(&world, vec![handle], seed * 31 + a, &reported))
        })
        .collect();
    for a in actors {
        a.join().unwrap();
    }
    let mut world = Arc::try_unwrap(world).unwrap_or_else(|_| panic!("seed {seed}: shared"));
    let cpus = world.cpus.clone();
    if let Some(main) = main {
        if seed.is_multiple_of(4) {
            let report = main.shutdown();
            reported.fetch_add(report.panicked.len(), Ordering::SeqCst);
        }
        drop(main);
    }
    for it in &world.items {
        for cpu in cpus.iter() {
            if let Err(e) = it.work.flush(cpu) {
                tally(&e, &reported, &format!("seed {seed}: final flush"));
            }
        }
    }
    if let Some(owners) = world.owners.take() {
        owners.stop.store(true, Ordering::SeqCst);
        for t in owners.threads {
            t.join().unwrap();
        }
    }
    // The short-lived items are gone, so nothing can be flushed: their runs must still
    // happen, which a bounded wait sees (a liveness bound, not a timing claim).
    let start = std::time::Instant::now();
    while world.temp_runs.load(Ordering::SeqCst) < world.temp_accepted.load(Ordering::SeqCst) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "seed {seed}: a dropped item's queued run never ran"
        );
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        world.temp_runs.load(Ordering::SeqCst),
        world.temp_accepted.load(Ordering::SeqCst),
        "seed {seed}: runs of dropped items"
    );
    let (mut runs, mut accepted, mut panics) = (0, 0, 0);
    for it in &world.items {
        let (r, a) = (
            it.runs.load(Ordering::SeqCst),
            it.accepted.load(Ordering::SeqCst),
        );
        assert_eq!(
            r, a,
            "seed {seed}: runs of an item against the runs accepted"
        );
        runs += r;
        accepted += a;
        panics += it.panics.load(Ordering::SeqCst);
    }
    assert_eq!(
        reported.load(Ordering::SeqCst),
        panics,
        "seed {seed}: panics reported against panics that happened ({runs} runs, {accepted} accepted)"
    );
    let (added, sink, left) = (
        world.added.load(Ordering::SeqCst),
        world.sink.load(Ordering::SeqCst),
        (world.left)(),
    );
    assert_eq!(sink + left, added, "seed {seed}: conservation");
    [runs, panics, added]
}

fn stress(name: &str, make: impl Fn(u64) -> World + Send + Sync + 'static) {
    quiet_planned_panics();
    let base: u64 = std::env::var("QPW_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let name = name.to_string();
    within(Duration::from_secs(300), &name.clone(), move || {
        let mut totals = [0; 3];
        for r in 0..ROUNDS {
            let seed = base * 1000 + r;
            let counts = round(make(seed), seed);
            totals.iter_mut().zip(counts).for_each(|(t, c)| *t += c);
        }
        let [runs, panics, added] = totals;
        eprintln!(
            "{name}: {ROUNDS} rounds from seed {}: {runs} runs, {panics} panics, {added} units",
            base * 1000
        );
    });
}

#[test]
fn stress_lifecycle_queue() {
    stress("queue", |_| {
        locked_world::<qpw_core::FairLock>(logical(2, Policy::Queue), false)
    });
}

#[test]
fn stress_lifecycle_remote() {
    stress("remote", |_| {
        locked_world::<qpw_core::FairLock>(logical(2, Policy::Remote), true)
    });
}

#[test]
fn stress_lifecycle_mixed() {
    stress("mixed", |_| {
        locked_world::<qpw_core::FairLock>(logical(3, Policy::RemoteOn("1".parse().unwrap())), true)
    });
}

#[test]
fn stress_lifecycle_isolated() {
    stress("isolated", |_| {
        locked_world::<qpw_core::FairLock>(qpw_tests::instance(Policy::Isolated), true)
    });
}

#[test]
fn stress_lifecycle_rseq() {
    stress("rseq", |_| {
        let qpw = Qpw::builder().policy(Policy::Queue).build().unwrap();
        locked_world::<qpw_core::RseqLock>(qpw, false)
    });
}

#[test]
fn stress_lifecycle_owner_only() {
    stress("owner-only", |seed| {
        owned_world(logical(2, Policy::Queue), seed)
    });
}

/// What a drain reports for cpu 1 when the run's thread already holds cpu 1's lock through a
/// requester's guard: refused at once, in every build (issues 24 and 31).
fn assert_self_wait_ended(report: &qpw_core::DrainReport) {
    assert!(
        matches!(report.errors[..], [Error::Reentrant { cpu: 1, .. }]),
        "{report:?}"
    );
}
