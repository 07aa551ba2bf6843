//! One measuring thread, as cyclictest's `timerthread()`: its policy, its sleep to each
//! deadline (or its POSIX timer), its latency and catch-up after an overrun; and the wake-up
//! signal that ends a run within a bounded time.

use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::clock::{clock_ns, sleep_for_ns, sleep_until_unless};
use crate::hist::Histogram;

use super::{
    Align, Control, CyclicConfig, CyclicThread, Live, Policy, SleepMode, Spike, ThreadSpec, VALBUF,
    WAKE,
};

extern "C" fn on_wake(_signal: libc::c_int) {}

/// Installs [`WAKE`]'s no-op handler (once per process).
pub(super) fn install_wake() -> std::io::Result<()> {
    static INSTALLED: OnceLock<std::result::Result<(), i32>> = OnceLock::new();
    let done = INSTALLED.get_or_init(|| {
        // SAFETY: an all-zero sigaction is valid storage; the handler is an `extern "C"` fn
        // that does nothing (async-signal-safe); the mask is initialised before the call.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_wake as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = 0;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(WAKE, &sa, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        Ok(())
    });
    done.map_err(std::io::Error::from_raw_os_error)
}

/// Wakes the threads of `handles` that have not ended with [`WAKE`], again every 10 ms until
/// each has ended (a signal that came just before a thread went to sleep is lost on it), for
/// at most 10 s (a thread stuck elsewhere is then left to the join).
pub(super) fn wake_threads<T>(handles: &[std::thread::JoinHandle<T>]) {
    use std::os::unix::thread::JoinHandleExt as _;
    let start = Instant::now();
    while handles.iter().any(|h| !h.is_finished()) && start.elapsed() < Duration::from_secs(10) {
        for h in handles.iter().filter(|h| !h.is_finished()) {
            // SAFETY: the thread is joinable and not joined yet (its handle is here), so its
            // pthread_t is valid even if it has just ended; WAKE has a handler or is blocked.
            unsafe { libc::pthread_kill(h.as_pthread_t(), WAKE) };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sets the calling thread's policy and priority.
fn set_policy(policy: Policy, prio: i32) -> std::io::Result<()> {
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, policy.raw(), &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A POSIX interval timer that signals one thread (cyclictest's `-x`), deleted on drop.
struct PosixTimer {
    id: libc::timer_t,
    set: libc::sigset_t,
}

impl PosixTimer {
    /// A timer on `clock` that sends SIGALRM to the calling thread every `interval`, the
    /// first at `first_ns` (absolute); SIGALRM (and [`WAKE`]) are blocked in the thread so
    /// `sigwait` takes them.
    fn start(clock: libc::clockid_t, first_ns: u64, interval: Duration) -> std::io::Result<Self> {
        let os = std::io::Error::last_os_error;
        // SAFETY: an all-zero sigset_t is valid storage for sigemptyset to initialise.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is valid, writable storage; SIGALRM is a valid signal number.
        unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGALRM);
            // And the end of the run's wake-up, taken in the same `sigwait`.
            libc::sigaddset(&mut set, WAKE);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        // SAFETY: an all-zero sigevent is valid; the fields we need are set below.
        let mut ev: libc::sigevent = unsafe { std::mem::zeroed() };
        ev.sigev_notify = libc::SIGEV_THREAD_ID | libc::SIGEV_SIGNAL;
        ev.sigev_signo = libc::SIGALRM;
        // SAFETY: gettid has no preconditions.
        ev.sigev_notify_thread_id = unsafe { libc::gettid() };
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: `ev` and `id` are valid for the call.
        if unsafe { libc::timer_create(clock, &mut ev, &mut id) } != 0 {
            return Err(os());
        }
        let ts = |ns: u64| libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: ts(interval.as_nanos() as u64),
            it_value: ts(first_ns),
        };
        // SAFETY: `id` was created above; `spec` is valid; the old value may be null.
        if unsafe { libc::timer_settime(id, libc::TIMER_ABSTIME, &spec, std::ptr::null_mut()) } != 0
        {
            let e = os();
            // SAFETY: `id` is a timer we created and delete once.
            unsafe { libc::timer_delete(id) };
            return Err(e);
        }
        Ok(Self { id, set })
    }

    /// Waits for the next expiry; returns the expiries missed since the last one.
    fn wait(&self) -> u64 {
        let mut sig = 0;
        // SAFETY: `self.set` was initialised in `start`; `sig` is writable.
        unsafe { libc::sigwait(&self.set, &mut sig) };
        // SAFETY: `self.id` is a live timer.
        let over = unsafe { libc::timer_getoverrun(self.id) };
        over.max(0) as u64
    }
}

impl Drop for PosixTimer {
    fn drop(&mut self) {
        // SAFETY: `self.id` is a timer we created and delete once.
        unsafe { libc::timer_delete(self.id) };
    }
}

/// One measuring thread, as cyclictest's `timerthread()`: pinned, at its policy, it meets the
/// others at the start, then sleeps to each deadline and counts how late it woke, catching up
/// after an overrun, until the run ends.
pub(super) fn thread_main(
    index: usize,
    spec: &ThreadSpec,
    cfg: &CyclicConfig,
    ctl: &Control,
    live: &Live,
) -> Result<CyclicThread> {
    // Pin, take the policy and priority, say our tid.
    let who = format!("cyclictest thread {index}");
    let (_binding, tid) = enter(&who, spec, cfg, ctl, live)?;
    let unit = cfg.unit_ns();
    let mut t = CyclicThread::new(spec, cfg, tid)?;
    let interval = spec.interval.as_nanos() as u64;
    let op_every = cfg.local_op.as_ref().map(|op| {
        let per = op.every.as_nanos() as u64 / interval.max(1);
        per.max(1)
    });
    ctl.started.fetch_add(1, Ordering::SeqCst);
    while !ctl.go.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }

    let now = first_deadline(cfg, ctl, index);
    let mut next = now + interval;
    let stop_at = cfg.duration.map(|d| now + d.as_nanos() as u64);
    if let Some(end) = stop_at {
        ctl.end_ns.fetch_max(end, Ordering::SeqCst);
    }
    let timer = match cfg.sleep {
        SleepMode::PosixTimer => Some(
            PosixTimer::start(cfg.clock, next, spec.interval)
                .with_context(|| format!("{who}: cannot start a POSIX timer"))?,
        ),
        _ => None,
    };
    while !ctl.stop.load(Ordering::Relaxed) {
        // Wait for the next period.
        let Some(missed) = sleep_to_next(cfg, &mut next, interval, timer.as_ref(), ctl) else {
            break;
        };
        let now = clock_ns(cfg.clock);
        // Woken before the deadline because the run ends: no sample, as cyclictest's thread
        // leaves its loop when its sleep is interrupted.
        if now < next && ctl.stop.load(Ordering::SeqCst) {
            break;
        }
        // calcdiff(): whole microseconds, truncated (or nanoseconds with -N).
        let diff = now.saturating_sub(next) / unit;
        let wake = Wake { now, next, diff };
        record(&mut t, &wake, cfg, ctl, live, index, stop_at);
        if let (Some(op), Some(every)) = (&cfg.local_op, op_every) {
            if t.cycles.is_multiple_of(every) {
                match op.workload.process_op() {
                    Ok(()) => t.local_ops += 1,
                    Err(_) => t.local_op_errors += 1,
                }
            }
        }
        next += interval * (1 + missed);
        // An overrun: move the deadline past now by whole intervals.
        if now > next {
            t.overruns += 1;
            while now > next {
                next += interval;
            }
        }
        // A thread that reaches -l ends alone, as in cyclictest; the main loop stops the others
        // once it has seen it, so they show fewer cycles.
        if cfg.loops > 0 && t.cycles >= cfg.loops {
            break;
        }
    }
    Ok(t)
}

/// Pins the thread (registering it with the workload's instance), sets its policy and
/// priority (a warning when refused), and publishes its tid; returns the binding, held for the
/// thread's life, and the tid.
fn enter(
    who: &str,
    spec: &ThreadSpec,
    cfg: &CyclicConfig,
    ctl: &Control,
    live: &Live,
) -> Result<(Option<qpw_core::Binding>, i32)> {
    let binding = crate::rt::enter_probe_cpu(
        cfg.local_op.as_ref().map(|op| &*op.qpw),
        spec.cpu,
        None,
        who,
        &ctl.warnings,
    )?;
    if let Err(e) = set_policy(spec.policy, spec.prio) {
        let how = if e.kind() == std::io::ErrorKind::PermissionDenied {
            format!(" ({})", crate::rt::rt_priority_hint(spec.prio))
        } else {
            String::new()
        };
        ctl.warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!(
                "{who} on cpu {} runs SCHED_OTHER, not {} at priority {}: {e}{how}",
                spec.cpu,
                spec.policy.name(),
                spec.prio
            ));
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    live.tid.store(tid, Ordering::Relaxed);
    Ok((binding, tid))
}

impl CyclicThread {
    /// A thread's figures before its first wake-up.
    fn new(spec: &ThreadSpec, cfg: &CyclicConfig, tid: i32) -> Result<Self> {
        let unit = cfg.unit_ns();
        // Our histogram: cyclictest's when -h was given (its overflows are ours), else one wide
        // enough for the percentiles we add (past it, exact values up to a limit).
        let buckets = cfg
            .histogram
            .unwrap_or(if cfg.nsecs { 100_000 } else { 10_000 });
        let mut t = CyclicThread {
            cpu: spec.cpu,
            tid,
            hist: Histogram::whole_units(buckets, unit),
            cycles: 0,
            sum: 0,
            min: 1_000_000,
            max: 0,
            act: 0,
            overruns: 0,
            outliers: Vec::with_capacity(cfg.histogram.unwrap_or(0).min(1 << 20)),
            local_ops: 0,
            local_op_errors: 0,
            late: Vec::new(),
            late_not_kept: 0,
        };
        if cfg.late_log.is_some() {
            t.late
                .try_reserve_exact(crate::oslat::GAP_LOG_CAPACITY)
                .map_err(|e| anyhow::anyhow!("cannot set aside the late wake-up log: {e}"))?;
        }
        Ok(t)
    }
}

/// The first deadline's base: now, or the threads' common start (`-A`: each offset by its
/// index), or the next whole second (`--secaligned`).
fn first_deadline(cfg: &CyclicConfig, ctl: &Control, index: usize) -> u64 {
    let mut now = clock_ns(cfg.clock);
    match cfg.align {
        Align::None => {}
        Align::Threads(offset) => {
            now = ctl.start_ns.load(Ordering::SeqCst) + offset.as_nanos() as u64 * index as u64;
        }
        Align::Second(offset) => {
            let start = ctl.start_ns.load(Ordering::SeqCst);
            let (secs, frac) = (start / 1_000_000_000, start % 1_000_000_000);
            let skip = if frac > 900_000_000 { 2 } else { 1 };
            now = (secs + skip) * 1_000_000_000 + offset.as_nanos() as u64;
        }
    }
    now
}

/// Sleeps until the next period as `-s`, `-r`, `--posix_timers` or the default absolute
/// sleep asks; returns the timer's missed periods, or `None` when the run ends during the
/// sleep.
#[inline]
fn sleep_to_next(
    cfg: &CyclicConfig,
    next: &mut u64,
    interval: u64,
    timer: Option<&PosixTimer>,
    ctl: &Control,
) -> Option<u64> {
    let mut missed = 0;
    match cfg.sleep {
        SleepMode::Absolute => {
            if !sleep_until_unless(cfg.clock, *next, &ctl.stop) {
                return None;
            }
        }
        SleepMode::Relative | SleepMode::Nanosleep => {
            let before = clock_ns(cfg.clock);
            sleep_for_ns(cfg.clock, interval, cfg.sleep == SleepMode::Nanosleep);
            *next = before + interval;
        }
        SleepMode::PosixTimer => {
            if let Some(timer) = timer {
                missed = timer.wait();
            }
        }
    }
    Some(missed)
}

/// One wake-up: when it came, its deadline, and the latency in units.
struct Wake {
    now: u64,
    next: u64,
    diff: u64,
}

/// Counts one wake-up in the thread's figures, the live figures the main thread reads, the
/// late wake-up log, `--spike`'s list, and `-D` and `-b`'s stops.
#[inline]
fn record(
    t: &mut CyclicThread,
    wake: &Wake,
    cfg: &CyclicConfig,
    ctl: &Control,
    live: &Live,
    index: usize,
    stop_at: Option<u64>,
) {
    let Wake { now, next, diff } = *wake;
    let unit = cfg.unit_ns();
    if let Some((from_ns, cal)) = cfg.late_log {
        let late_ns = now.saturating_sub(next);
        if late_ns >= from_ns {
            // The same span on the probe counter (the trace's clock): deadline to now.
            let woke = crate::clock::ticks();
            if t.late.len() < crate::oslat::GAP_LOG_CAPACITY {
                t.late
                    .push((woke.saturating_sub(cal.from_ns(late_ns)), woke));
            } else {
                t.late_not_kept += 1;
            }
        }
    }
    t.cycles += 1;
    t.sum += diff;
    t.act = diff;
    t.min = t.min.min(diff);
    if diff > t.max {
        t.max = diff;
        live.max.store(diff, Ordering::Relaxed);
    }
    live.min.store(t.min, Ordering::Relaxed);
    live.act.store(diff, Ordering::Relaxed);
    live.sum.store(t.sum, Ordering::Relaxed);
    if let Some(slot) = live.values.get((t.cycles - 1) as usize & (VALBUF - 1)) {
        slot.store(diff, Ordering::Relaxed);
    }
    if let Some((trigger, nodes)) = cfg.spike {
        if diff > trigger {
            spike(ctl, nodes, index, diff, now / 1000);
        }
    }
    if stop_at.is_some_and(|s| now >= s) {
        ctl.stop.store(true, Ordering::SeqCst);
    }
    if cfg.breaktrace.is_some_and(|b| diff > b) {
        let mut hit = ctl.break_hit.lock().unwrap_or_else(|e| e.into_inner());
        hit.get_or_insert((t.tid, diff));
        ctl.stop.store(true, Ordering::SeqCst);
    }
    // The histogram: past its last bucket an overflow, listed by cycle number.
    if let Some(h) = cfg.histogram {
        if diff >= h as u64 && t.outliers.len() < h {
            t.outliers.push(t.cycles - 1);
        }
    }
    t.hist.record(diff * unit);
    live.cycles.store(t.cycles, Ordering::Release);
}

#[cold]
fn spike(ctl: &Control, nodes: usize, thread: usize, value: u64, at_us: u64) {
    ctl.spike_count.fetch_add(1, Ordering::Relaxed);
    let mut list = ctl.spikes.lock().unwrap_or_else(|e| e.into_inner());
    if list.len() < nodes {
        list.push(Spike {
            thread,
            value,
            at_us,
        });
    }
}
