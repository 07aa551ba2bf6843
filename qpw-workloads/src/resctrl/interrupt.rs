//! Read path 2, the interrupt (`smp_call_function_single`): the reader's own CPU when it is
//! in the domain, else a signal to the thread running on a domain CPU.
//!
//! An IPI interrupts whatever the CPU runs. Userspace can only signal a thread, and a signal
//! to a thread that is runnable but not running waits for that thread's next turn, which an
//! IPI never does. On a busy CPU (several runnable threads, as on a fleet machine) the path
//! must therefore signal the one that runs *now*. Each thread registered for a CPU
//! ([`Resctrl::register_current_thread`]) takes a slot of that CPU, and a thread says it is
//! the one running by [`DomainThread::running_now`], a plain store to its CPU's slot marker
//! that a busy loop can afford on every iteration; the path signals the thread the marker
//! names. The named thread may lose the CPU between the choice and the signal (its slice
//! ends): a call it has not claimed within `Config::retarget_after` (50 us) is withdrawn and
//! sent to the thread named then, and so on until it runs or the call times out, the reader
//! spinning all along as an IPI's sender spins in `csd_lock_wait` (re-sent only every
//! millisecond to a thread that is still the one named, so that its pending signals stay
//! few; and for a thread on the reader's own physical CPU, which spinning would keep from
//! running, the reader sleeps instead, as [`cross_call::call_on`] does). A CPU with no
//! registered thread gets an idle stand-in, asleep there, which the signal wakes like any
//! sleeper.

use std::fmt;
use std::iter;
use std::time::{Duration, Instant};

use qpw_core::cross_call::{self, CallCtx, CallReport, CallTarget, CrossCallError};
use qpw_core::sync::{
    thread, Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering,
};

use super::error::ResctrlError;
use super::event::Event;
use super::file::MonFile;
use super::groups::RdtState;
use super::hardware::{Executing, Hardware};
use super::model::{lock, Domain, Resctrl, Shared, Startup};
use super::read::Executed;
use super::value::{Executor, ReadValue};

/// How long a call may wait to be claimed by the thread it was sent to before it is sent to
/// the thread running now instead, unless configured ([`Config::retarget_after`](super::Config::retarget_after)): several
/// times a signal's usual delivery here (5-10 us), far below a scheduler slice.
pub const RETARGET_AFTER: Duration = Duration::from_micros(50);

/// How many times a call may be re-sent before the reader just waits for it, unless
/// configured ([`Config::retargets`](super::Config::retargets)): no limit but the call's
/// timeout.
pub const RETARGETS: u32 = u32::MAX;

/// How long a call waits before it is sent again to the same thread, when the CPU's marker
/// still names it (no other registered thread has run there since): long enough that its
/// queue of pending signals stays short.
const SAME_TARGET_PATIENCE: Duration = Duration::from_millis(1);

/// The most threads that may be registered for one CPU at a time.
pub const MAX_THREADS_PER_CPU: usize = 16;

/// One CPU's marker: the slot of the registered thread that last said it runs there, alone on
/// its cache line (the threads of that CPU write it, the readers read it).
#[repr(align(128))]
#[derive(Debug)]
struct RunningSlot(AtomicUsize);

/// The threads the interrupt path may interrupt.
#[derive(Debug)]
pub(super) struct Targets {
    /// One cross-call id space per slot: the k-th thread registered for a CPU registers in
    /// `spaces[k]` (a space holds one thread per CPU).
    spaces: Vec<u64>,
    /// Per CPU id: its [`RunningSlot`].
    running: Box<[RunningSlot]>,
    /// Serialises registrations, so that two threads of one CPU never take the same slot.
    registering: Mutex<()>,
    /// Where the idle stand-ins register.
    idle_space: u64,
    /// The idle stand-ins started so far: their stop flags and threads.
    idle: Mutex<Vec<(Arc<AtomicBool>, thread::JoinHandle<()>)>>,
}

impl Targets {
    /// Targets for CPU ids `0..=max_cpu`.
    pub(super) fn new(max_cpu: usize) -> Self {
        Self {
            spaces: (0..MAX_THREADS_PER_CPU)
                .map(|_| cross_call::new_space())
                .collect(),
            running: (0..=max_cpu)
                .map(|_| RunningSlot(AtomicUsize::new(0)))
                .collect(),
            registering: Mutex::new(()),
            idle_space: cross_call::new_space(),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The space of the registered thread of `cpu` to interrupt: the one its marker names,
    /// else any registered one.
    fn registered(&self, cpu: usize) -> Option<u64> {
        let named = self.running.get(cpu)?.0.load(Ordering::Relaxed);
        iter::once(named)
            .chain(0..MAX_THREADS_PER_CPU)
            .filter_map(|slot| self.spaces.get(slot).copied())
            .find(|&space| cross_call::has_target(space, cpu))
    }

    /// Stops and joins the idle stand-ins.
    pub(super) fn stop_idle(&self) {
        let idle = std::mem::take(&mut *lock(&self.idle));
        for (stop, handle) in idle {
            stop.store(true, Ordering::Release);
            let _ = handle.join();
        }
    }
}

/// A thread registered as running on a CPU of the model, which the interrupt path interrupts
/// (in a signal handler) to read that CPU's domain. Dropping it unregisters the thread. Not
/// `Send`: it names the thread that made it.
#[must_use = "dropping the registration unregisters the thread at once"]
pub struct DomainThread {
    target: CallTarget,
    slot: usize,
    shared: Arc<Shared>,
}

impl fmt::Debug for DomainThread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DomainThread")
            .field("cpu", &self.target.cpu())
            .field("slot", &self.slot)
            .field("calls", &self.target.calls())
            .finish()
    }
}

impl DomainThread {
    /// Says that this thread is the one running on its CPU now, so that the interrupt path
    /// signals it rather than a thread of the same CPU that waits for its turn. One relaxed
    /// store to a line of this CPU's own: cheap enough for every iteration of a busy loop.
    #[inline]
    pub fn running_now(&self) {
        self.shared.targets.running[self.target.cpu()]
            .0
            .store(self.slot, Ordering::Relaxed);
    }

    /// The CPU this thread is registered for.
    pub fn cpu(&self) -> usize {
        self.target.cpu()
    }

    /// How many reads this thread was interrupted to run.
    pub fn calls(&self) -> u64 {
        self.target.calls()
    }

    /// The physical CPU the last of them ran on, if any ran.
    pub fn last_phys_cpu(&self) -> Option<usize> {
        self.target.last_phys_cpu()
    }
}

impl Resctrl {
    /// Registers the calling thread as a thread running on `cpu`: the interrupt path
    /// interrupts it to read that CPU's domain. Bind it to `cpu` first
    /// ([`Qpw::bind_current`](qpw_core::Qpw::bind_current)). Up to
    /// [`MAX_THREADS_PER_CPU`] threads may be registered for one CPU; a busy CPU's threads
    /// should call [`DomainThread::running_now`] as they run.
    pub fn register_current_thread(&self, cpu: usize) -> Result<DomainThread, ResctrlError> {
        self.qpw.physical_cpu(cpu)?;
        let targets = &self.shared.targets;
        let _serial = lock(&targets.registering);
        let slot = (0..MAX_THREADS_PER_CPU)
            .find(|&k| !cross_call::has_target(targets.spaces[k], cpu))
            .ok_or(ResctrlError::TooManyThreads {
                cpu,
                max: MAX_THREADS_PER_CPU,
            })?;
        let target = CallTarget::register(targets.spaces[slot], cpu)?;
        Ok(DomainThread {
            target,
            slot,
            shared: self.shared.clone(),
        })
    }

    /// Interruptions of the threads registered now for `cpu` (idle stand-ins included).
    pub fn interruptions_on(&self, cpu: usize) -> u64 {
        let targets = &self.shared.targets;
        targets
            .spaces
            .iter()
            .chain(iter::once(&targets.idle_space))
            .map(|&space| cross_call::calls_on(space, cpu))
            .sum()
    }

    /// Interruptions of the idle stand-in of `cpu` (started when a read found no registered
    /// thread in the domain).
    pub fn stand_in_interruptions_on(&self, cpu: usize) -> u64 {
        cross_call::calls_on(self.shared.targets.idle_space, cpu)
    }

    /// Path 2 (Shakeel Butt's RFC): when every CPU of the domain is `nohz_full`, the
    /// `smp_call_function_any` fallback; else the reader's own CPU if it is in the domain and
    /// not `nohz_full`, else interrupt the thread running on a CPU of the domain.
    pub(super) fn smp_call_function_single(
        &self,
        state: &MutexGuard<'_, RdtState>,
        file: &MonFile,
    ) -> Result<Executed, ResctrlError> {
        if self.shared.domains[file.domain].all_nohz_full {
            return self.nohz_full_fallback(state, file);
        }
        let reader = self
            .reader_cpu_in(file.domain)
            .filter(|&cpu| !self.shared.nohz_full.contains(cpu));
        if let Some(cpu) = reader {
            self.shared
                .counts
                .reader_direct
                .fetch_add(1, Ordering::Relaxed);
            return Ok(self.mon_event_count_here(file, cpu));
        }
        self.interrupt_domain(state, file)
    }

    /// `smp_call_function_any(domain)`, which `mon_event_read` uses when every CPU of the
    /// domain is `nohz_full` (its housekeeping pick is one of them): the reader's own CPU when
    /// it is in the domain, else an interrupt to a CPU of the domain, never a worker (the
    /// kernel's comment: MPAM may not read in IRQ context, but a `nohz_full` CPU must not be
    /// disturbed by a kworker either).
    pub(super) fn nohz_full_fallback(
        &self,
        state: &MutexGuard<'_, RdtState>,
        file: &MonFile,
    ) -> Result<Executed, ResctrlError> {
        let counts = &self.shared.counts;
        counts.nohz_fallbacks.fetch_add(1, Ordering::Relaxed);
        if let Some(cpu) = self.reader_cpu_in(file.domain) {
            counts.reader_direct.fetch_add(1, Ordering::Relaxed);
            return Ok(self.mon_event_count_here(file, cpu));
        }
        self.interrupt_domain(state, file)
    }

    /// Interrupts the thread running on a CPU of the file's domain to read it there.
    fn interrupt_domain(
        &self,
        state: &MutexGuard<'_, RdtState>,
        file: &MonFile,
    ) -> Result<Executed, ResctrlError> {
        let shared = &self.shared;
        let request = IpiRequest {
            hw: &shared.hw,
            domain: file.domain,
            rmid: file.rmid,
            event: file.event,
            status: AtomicU64::new(1),
            value: AtomicU64::new(0),
        };
        let (retarget_after, max_retargets) = shared.retarget;
        let posted = Instant::now();
        let mut retargets = 0;
        let mut sent_to = None;
        let (cpu, report) = loop {
            let (space, cpu) = self.interrupt_target(state, &shared.domains[file.domain])?;
            let left = shared.call_timeout.saturating_sub(posted.elapsed());
            // Spin for a thread that runs elsewhere, as an IPI's sender spins: re-sent soon
            // when the CPU has another thread running now, after a while when it is the same
            // one (its queue of signals stays short). Sleep, though, for a thread of the
            // reader's own physical CPU, which the spinning would keep from running.
            let beside = self.qpw.physical_cpu(cpu).ok() == qpw_core::current_cpu();
            let patience = if beside || retargets >= max_retargets {
                left
            } else if sent_to == Some((space, cpu)) {
                left.min(SAME_TARGET_PATIENCE)
            } else {
                left.min(retarget_after)
            };
            sent_to = Some((space, cpu));
            match call_on(space, cpu, &request, patience) {
                Err(CrossCallError::Timeout { .. }) if patience < left => {
                    retargets += 1;
                    shared.counts.retargets.fetch_add(1, Ordering::Relaxed);
                }
                Err(CrossCallError::Timeout { cpu, .. }) => {
                    return Err(CrossCallError::Timeout {
                        cpu,
                        timeout: shared.call_timeout,
                    }
                    .into())
                }
                outcome => break (cpu, outcome?),
            }
        };
        shared.counts.interrupts.fetch_add(1, Ordering::Relaxed);
        let value = ReadValue::decode(
            request.status.load(Ordering::Acquire),
            request.value.load(Ordering::Relaxed),
        );
        Ok((
            value,
            Executor::Interrupt {
                cpu,
                phys_cpu: report.phys_cpu,
            },
            Some(posted.elapsed()),
        ))
    }

    /// Where to send the interrupt: the thread running on the domain's housekeeping CPU,
    /// else on any of its CPUs, else an idle stand-in on the housekeeping CPU.
    fn interrupt_target(
        &self,
        state: &MutexGuard<'_, RdtState>,
        dom: &Domain,
    ) -> Result<(u64, usize), ResctrlError> {
        let targets = &self.shared.targets;
        let registered = iter::once(dom.housekeeping)
            .chain(dom.cpus.iter())
            .find_map(|cpu| targets.registered(cpu).map(|space| (space, cpu)));
        if let Some(found) = registered {
            return Ok(found);
        }
        self.ensure_idle_target(state, dom.housekeeping)?;
        Ok((targets.idle_space, dom.housekeeping))
    }

    /// Starts the idle stand-in of `cpu` if it has none: a thread pinned there, asleep, for
    /// the interrupt path to interrupt when no registered thread runs in the domain.
    fn ensure_idle_target(
        &self,
        _locked: &MutexGuard<'_, RdtState>,
        cpu: usize,
    ) -> Result<(), ResctrlError> {
        let targets = &self.shared.targets;
        if cross_call::has_target(targets.idle_space, cpu) {
            return Ok(());
        }
        // `_locked` proves rdtgroup_mutex is held: the check above and the start below are
        // one step, so a CPU never gets two stand-ins.
        let phys = self.qpw.physical_cpu(cpu)?;
        let stop = Arc::new(AtomicBool::new(false));
        let startup = Arc::new(Startup::default());
        let (s, report, space) = (stop.clone(), startup.clone(), targets.idle_space);
        let handle = thread::Builder::new()
            .name(format!("resctrl-idle/{cpu}"))
            .spawn(move || idle_stand_in(space, cpu, phys, &s, &report))
            .map_err(|source| ResctrlError::Spawn {
                what: "idle stand-in",
                source,
            })?;
        let started = startup.wait();
        lock(&targets.idle).push((stop, handle));
        // A stand-in that is not on its CPU, or not registered, must not be interrupted: the
        // read fails, naming why.
        started.map_err(|reason| ResctrlError::Pin {
            what: "idle stand-in",
            cpu,
            phys,
            reason,
        })
    }
}

/// The interrupt path's request, lent to the handler on the reader's stack.
struct IpiRequest<'a> {
    hw: &'a Hardware,
    domain: usize,
    rmid: u32,
    event: Event,
    status: AtomicU64,
    value: AtomicU64,
}

/// Sends `request` to the thread registered for `cpu` in `space` and waits up to `patience`
/// for it to be claimed (then to be done).
fn call_on(
    space: u64,
    cpu: usize,
    request: &IpiRequest<'_>,
    patience: Duration,
) -> Result<CallReport, CrossCallError> {
    // SAFETY: (1) `ipi_mon_event_count` is async-signal-safe: it calls `Hardware::rmid_read`,
    // which only loads and stores atomics and reads immutable slices, and stores its result
    // into atomics; (2) `request` is borrowed for this call, which returns after the handler
    // ran or after the call was withdrawn (then it never runs).
    unsafe {
        cross_call::call_on(
            space,
            cpu,
            ipi_mon_event_count,
            request as *const IpiRequest<'_> as *const (),
            patience,
        )
    }
}

/// The handler side of path 2 (`mon_event_count` in IPI context): async-signal-safe.
fn ipi_mon_event_count(ctx: &CallCtx, arg: *const ()) {
    // SAFETY: `smp_call_function_single` passes a pointer to an `IpiRequest` that outlives
    // the call (it waits for the call before returning).
    let req = unsafe { &*(arg as *const IpiRequest<'_>) };
    // Where the handler executes, as the hardware sees it: the CPU the interrupted thread is
    // registered for, and the physical CPU it was interrupted on.
    let on = Some(Executing {
        cpu: ctx.cpu(),
        phys: ctx.phys_cpu(),
    });
    let (status, value) = req
        .hw
        .rmid_read(on, req.domain, req.rmid, req.event)
        .encode();
    req.value.store(value, Ordering::Relaxed);
    req.status.store(status, Ordering::Release);
}

/// An idle stand-in: pinned on `phys`, registered for `cpu`, asleep until stopped; its
/// [`Startup`] says whether it got there.
fn idle_stand_in(space: u64, cpu: usize, phys: usize, stop: &AtomicBool, startup: &Startup) {
    let registered = qpw_core::pin_current_thread(phys)
        .map_err(|e| e.to_string())
        .and_then(|()| CallTarget::register(space, cpu).map_err(|e| e.to_string()));
    let _target = match registered {
        Ok(target) => {
            startup.report(Ok(()));
            target
        }
        Err(reason) => {
            startup.report(Err(reason));
            return;
        }
    };
    while !stop.load(Ordering::Acquire) {
        // Asleep like an idle CPU; a cross call interrupts the sleep and runs in the handler.
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 20_000_000,
        };
        // SAFETY: `ts` is a valid timespec; the remainder is not asked for.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    }
}
