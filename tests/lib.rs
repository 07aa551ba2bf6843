//! Helpers shared by the cross-crate tests: real spinners and fake topologies.

#![warn(missing_docs)]
#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use qpw_core::{FakeSysfs, Policy, Qpw};

/// How a [`Spinner`] got its CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpinnerClass {
    /// `SCHED_FIFO` at the given priority: it never yields, like an isolated RT task.
    Fifo(i32),
    /// `SCHED_OTHER`: the best we can do without permission for `SCHED_FIFO`.
    Other,
}

/// A thread pinned to one CPU that spins until stopped (or for at most `max`, so that a failed
/// test cannot leave a CPU monopolised).
#[derive(Debug)]
pub struct Spinner {
    stop: Arc<AtomicBool>,
    handle: Option<thread::JoinHandle<()>>,
    /// The scheduling class the spinner got.
    pub class: SpinnerClass,
    /// The spinner's thread id, for [`involuntary_switches`].
    pub tid: i32,
}

impl Spinner {
    /// Starts a spinner on `cpu`, `SCHED_FIFO` at `priority` if permitted, and waits until it
    /// spins.
    pub fn start(cpu: usize, priority: i32, max: Duration) -> Spinner {
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = {
            let (stop, started) = (stop.clone(), started.clone());
            thread::Builder::new()
                .name(format!("spinner/{cpu}"))
                .spawn(move || {
                    qpw_core::pin_current_thread(cpu).expect("pin the spinner");
                    let class = match qpw_core::set_current_fifo(priority) {
                        Ok(()) => SpinnerClass::Fifo(priority),
                        Err(_) => SpinnerClass::Other,
                    };
                    // SAFETY: `gettid` has no preconditions.
                    let tid = unsafe { libc::gettid() };
                    tx.send((class, tid)).expect("report the class");
                    started.store(true, Ordering::Release);
                    let deadline = Instant::now() + max;
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        std::hint::spin_loop();
                    }
                })
                .expect("spawn the spinner")
        };
        let (class, tid) = rx.recv().expect("the spinner reports its class");
        while !started.load(Ordering::Acquire) {
            thread::yield_now();
        }
        Spinner {
            stop,
            handle: Some(handle),
            class,
            tid,
        }
    }

    /// Stops the spinner and waits for it to exit.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.halt();
    }
}

/// How often thread `tid` of this process has been preempted: `nonvoluntary_ctxt_switches` of
/// `/proc/self/task/<tid>/status`. A vCPU the hypervisor does not run leaves it alone, so it counts
/// what our own kernel did to the thread and nothing else.
pub fn involuntary_switches(tid: i32) -> u64 {
    let path = format!("/proc/self/task/{tid}/status");
    let status = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{path} has no nonvoluntary_ctxt_switches line"))
}

/// The kernel's RT throttling: `sched_rt_runtime_us` of each `sched_rt_period_us` (-1: off), as
/// text for test output.
pub fn rt_throttling() -> String {
    let read = |f: &str| {
        std::fs::read_to_string(format!("/proc/sys/kernel/{f}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unknown ({e})"))
    };
    format!(
        "sched_rt_runtime_us {} of sched_rt_period_us {}",
        read("sched_rt_runtime_us"),
        read("sched_rt_period_us")
    )
}

/// A fake sysfs tree whose online CPUs are the allowed ones and whose last allowed CPU is
/// isolated, for the `isolated` policy on a machine without isolated CPUs.
pub fn fake_isolated_last() -> (tempfile::TempDir, usize) {
    let allowed = qpw_core::allowed_cpus().expect("sched_getaffinity");
    let last = allowed.last().expect("at least one CPU");
    let dir = tempfile::tempdir().expect("tempdir");
    FakeSysfs::new(&allowed.to_string())
        .isolated(&last.to_string())
        .write(dir.path())
        .expect("write the fake sysfs");
    (dir, last)
}

/// An instance over the allowed CPUs with `policy`; for `Isolated`, the last CPU is faked as
/// isolated. The tempdir (if any) must outlive nothing: the topology is read at build time.
pub fn instance(policy: Policy) -> Qpw {
    let builder = Qpw::builder().policy(policy.clone());
    let qpw = if policy == Policy::Isolated {
        let (dir, _) = fake_isolated_last();
        builder.sysfs_root(dir.path()).build()
    } else {
        builder.build()
    };
    qpw.expect("build the instance")
}

/// A gate that work items can wait at until a test opens it: holds a worker busy on purpose.
#[derive(Debug, Default)]
pub struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Arc<Gate> {
        Arc::default()
    }

    /// Waits until the gate is open.
    pub fn wait(&self) {
        let mut open = self.open.lock().expect("gate lock");
        while !*open {
            open = self.opened.wait(open).expect("gate lock");
        }
    }

    /// Opens the gate for every waiter, now and later.
    pub fn open(&self) {
        *self.open.lock().expect("gate lock") = true;
        self.opened.notify_all();
    }
}

/// A one-CPU queue-mode instance (one worker), for tests of the queue protocol.
pub fn one_queue_cpu() -> Qpw {
    Qpw::builder()
        .cpus(qpw_core::CpuSpec::Logical(1))
        .policy(Policy::Queue)
        .build()
        .expect("build the instance")
}

/// Runs `f` on a thread of its own and fails the calling test if `f` has not returned within
/// `limit`: a hang becomes a failure that names `what`, not a CI job stuck for hours. A panic
/// of `f` is passed on as it is. A hung thread cannot be killed: it is left behind, blocked,
/// until the test process exits.
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = thread::Builder::new()
        .name(format!("within/{what}"))
        .spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
        })
        .expect("spawn the watched thread");
    match rx.recv_timeout(limit) {
        Ok(Ok(value)) => {
            let _ = handle.join();
            value
        }
        Ok(Err(payload)) => std::panic::resume_unwind(payload),
        Err(_) => panic!("{what}: still running after {limit:?}, a hang"),
    }
}

/// A cheap per-thread pseudo-random sequence (xorshift), so that the schedule of yields and
/// migrations of the stress tests differs between threads without a dependency.
#[derive(Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next number of the sequence (the seed must not be zero).
    pub fn roll(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Gives the CPU away (`sched_yield`): inside a critical section, a preempted holder.
pub fn yield_now() {
    // SAFETY: `sched_yield` has no preconditions.
    unsafe { libc::sched_yield() };
}

/// Runs the test `name` of the current test binary again in a child process where glibc does
/// not register rseq (`GLIBC_TUNABLES=glibc.pthread.rseq=0`), with `marker` set in its
/// environment; asserts that it passed and returns its standard output.
pub fn run_without_rseq(name: &str, marker: &str) -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let output = std::process::Command::new(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("GLIBC_TUNABLES", "glibc.pthread.rseq=0")
        .env(marker, "1")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "child failed: {}\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("1 passed"), "{stdout}");
    stdout
}

/// The schedule of one stress thread: when it migrates and when it gives the CPU away while
/// holding a lock, drawn from an [`Rng`].
#[derive(Debug)]
pub struct Churn {
    rng: Rng,
    roll: u64,
    allowed: qpw_core::CpuSet,
    moves: bool,
    /// How many times the thread moved itself.
    pub migrations: u64,
}

impl Churn {
    /// The schedule of the `index`-th thread, moving between the `allowed` CPUs if `moves`
    /// (a bound thread does not).
    pub fn new(index: usize, allowed: qpw_core::CpuSet, moves: bool) -> Self {
        Self {
            rng: Rng(0x9e37_79b9_7f4a_7c15 ^ (index as u64 + 1)),
            roll: 0,
            allowed,
            moves,
            migrations: 0,
        }
    }

    /// Before an operation: sometimes migrate, to one CPU or back to all of them.
    pub fn before_op(&mut self) {
        self.roll = self.rng.roll();
        if self.moves && self.roll.is_multiple_of(1024) {
            let target = self.pick(self.roll >> 20);
            let set = if self.roll & (1 << 40) != 0 {
                qpw_core::CpuSet::from_iter([target])
            } else {
                self.allowed.clone()
            };
            qpw_core::set_current_affinity(&set).expect("move within the allowed CPUs");
            self.migrations += 1;
        }
    }

    /// While holding a lock: sometimes give the CPU away (waiters meet a preempted holder),
    /// sometimes migrate (the release is a plain store from another CPU).
    pub fn while_holding(&mut self) {
        if self.roll % 256 == 1 {
            yield_now();
        }
        if self.moves && self.roll % 2048 == 2 {
            let target = self.pick(self.roll >> 24);
            qpw_core::pin_current_thread(target).expect("move within the allowed CPUs");
            self.migrations += 1;
        }
    }

    fn pick(&self, bits: u64) -> usize {
        self.allowed.as_slice()[bits as usize % self.allowed.len()]
    }
}
