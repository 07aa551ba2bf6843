//! A fleet machine's load on the domain CPUs: several runnable threads per CPU.
//!
//! Seed 002's 360 ms per pass came from kworkers queued behind busy tasks: on a fleet machine
//! every CPU has several runnable threads, so a worker woken there waits for its turn (the
//! scheduler's slice, milliseconds), and the reader waits for the worker with
//! `rdtgroup_mutex` held. One busy thread per CPU does not show that: the woken worker, having
//! slept, preempts it at once. [`with_fleet_load`] runs `threads_per_cpu` busy threads bound to
//! each given CPU; each registers for the interrupt path (unless told not to) and says it is
//! running on every iteration ([`DomainThread::running_now`]), so that an interrupt reaches
//! the thread that runs, as an IPI reaches the CPU, while a worker still waits its turn.

use qpw_core::sync::{thread, AtomicBool, AtomicU64, Ordering};

use super::error::ResctrlError;
use super::interrupt::{DomainThread, MAX_THREADS_PER_CPU};
use super::model::Resctrl;

/// How to load the domain CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetLoad {
    /// Busy threads bound to each loaded CPU (0 to [`MAX_THREADS_PER_CPU`]; 0: idle).
    pub threads_per_cpu: usize,
    /// Whether the threads register as the ones the interrupt path interrupts. When not, the
    /// interrupt path signals an idle stand-in asleep on the domain's housekeeping CPU, which
    /// waits for its turn like a worker.
    pub interruptible: bool,
}

impl Default for FleetLoad {
    /// Eight busy threads per CPU, interruptible. On this project's 2-CPU VM (kernel 6.18,
    /// EEVDF), a worker woken among four busy threads still ran after about 170 us on
    /// average, among eight after about 1.4 ms (a slice): eight is where it waits its turn.
    fn default() -> Self {
        Self {
            threads_per_cpu: 8,
            interruptible: true,
        }
    }
}

/// The running load threads, as the body of [`with_fleet_load`] sees them.
#[derive(Debug)]
pub struct LoadThreads {
    tids: Vec<AtomicU64>,
}

impl LoadThreads {
    /// How many threads.
    pub fn len(&self) -> usize {
        self.tids.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.tids.is_empty()
    }

    /// Their involuntary context switches so far (`/proc/self/task/<tid>/status`): each is a
    /// preemption, by a worker, the reader, or one of them by another at the end of a slice.
    pub fn involuntary_switches(&self) -> u64 {
        self.tids
            .iter()
            .map(|t| nivcsw(t.load(Ordering::Relaxed) as i32))
            .sum()
    }
}

/// A thread's involuntary context switches, from `/proc/self/task/<tid>/status`.
fn nivcsw(tid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Runs `body` while `load.threads_per_cpu` busy threads run on each of `cpus` (CPUs of
/// `resctrl`), and stops and joins them after it, whatever `body` returns. A thread that
/// cannot bind or register makes the whole call fail, naming why.
pub fn with_fleet_load<R>(
    resctrl: &Resctrl,
    cpus: &[usize],
    load: FleetLoad,
    body: impl FnOnce(&LoadThreads) -> R,
) -> Result<R, ResctrlError> {
    if load.threads_per_cpu > MAX_THREADS_PER_CPU {
        return Err(ResctrlError::FiguresRange {
            what: "load threads per cpu",
            value: load.threads_per_cpu,
            lo: 0,
            hi: MAX_THREADS_PER_CPU,
        });
    }
    let placement: Vec<usize> = cpus
        .iter()
        .flat_map(|&cpu| std::iter::repeat_n(cpu, load.threads_per_cpu))
        .collect();
    let threads = LoadThreads {
        tids: placement.iter().map(|_| AtomicU64::new(0)).collect(),
    };
    let stop = AtomicBool::new(false);
    let started = AtomicU64::new(0);
    thread::scope(|scope| {
        let handles: Vec<_> = placement
            .iter()
            .enumerate()
            .map(|(i, &cpu)| {
                let (stop, started, threads) = (&stop, &started, &threads);
                scope.spawn(move || -> Result<(), ResctrlError> {
                    let setup = (|| {
                        let bound = resctrl.qpw().bind_current(cpu)?;
                        let registered: Option<DomainThread> = if load.interruptible {
                            Some(resctrl.register_current_thread(cpu)?)
                        } else {
                            None
                        };
                        Ok::<_, ResctrlError>((bound, registered))
                    })();
                    // SAFETY: `gettid` has no preconditions.
                    threads.tids[i].store(unsafe { libc::gettid() } as u64, Ordering::Relaxed);
                    started.fetch_add(1, Ordering::Release);
                    let (_bound, registered) = setup?;
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(me) = &registered {
                            me.running_now();
                        }
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                    Ok(())
                })
            })
            .collect();
        while started.load(Ordering::Acquire) < placement.len() as u64 {
            thread::yield_now();
        }
        // A thread that failed to bind or register has already returned: do not measure
        // with part of the load missing.
        let failed = handles.iter().any(|h| h.is_finished());
        let outcome = (!failed).then(|| body(&threads));
        stop.store(true, Ordering::Relaxed);
        for handle in handles {
            match handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(ResctrlError::Panicked { what: "load" }),
            }
        }
        outcome.ok_or(ResctrlError::Panicked { what: "load" })
    })
}
