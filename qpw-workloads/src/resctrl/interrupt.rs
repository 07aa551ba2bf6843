//! Read path 2, the interrupt (`smp_call_function_single`): the reader's own CPU when it is
//! in the domain, else a signal to the thread running on a domain CPU.

use qpw_core::cross_call::{self, CallCtx, CallTarget};
use qpw_core::sync::{thread, Arc, AtomicBool, AtomicU64, MutexGuard, Ordering};

use super::error::ResctrlError;
use super::event::Event;
use super::file::MonFile;
use super::groups::RdtState;
use super::hardware::Hardware;
use super::model::{lock, Resctrl};
use super::value::{Executor, ReadValue};

impl Resctrl {
    /// Registers the calling thread as the thread running on `cpu`: the interrupt path
    /// interrupts it to read that CPU's domain. Bind it to `cpu` first
    /// ([`Qpw::bind_current`](qpw_core::Qpw::bind_current)); its [`CallTarget::calls`] count its interruptions.
    pub fn register_current_thread(&self, cpu: usize) -> Result<CallTarget, ResctrlError> {
        self.qpw.physical_cpu(cpu)?;
        Ok(CallTarget::register(self.shared.space, cpu)?)
    }

    /// Interruptions of the threads registered now for `cpu` (idle stand-ins included).
    pub fn interruptions_on(&self, cpu: usize) -> u64 {
        cross_call::calls_on(self.shared.space, cpu)
            + cross_call::calls_on(self.shared.idle_space, cpu)
    }

    /// Path 2: the reader's own CPU if it is in the domain, else interrupt the thread running
    /// on a CPU of the domain.
    pub(super) fn smp_call_function_single(
        &self,
        state: &MutexGuard<'_, RdtState>,
        file: &MonFile,
    ) -> Result<(ReadValue, Executor), ResctrlError> {
        if let Some(cpu) = self.reader_cpu_in(file.domain) {
            self.shared
                .counts
                .reader_direct
                .fetch_add(1, Ordering::Relaxed);
            return Ok(self.mon_event_count_here(file, cpu));
        }
        let shared = &self.shared;
        let dom = &shared.domains[file.domain];
        // The housekeeping CPU's thread, else any domain CPU's, else an idle stand-in.
        let (space, cpu) = if cross_call::has_target(shared.space, dom.housekeeping) {
            (shared.space, dom.housekeeping)
        } else if let Some(c) = dom
            .cpus
            .iter()
            .find(|&c| cross_call::has_target(shared.space, c))
        {
            (shared.space, c)
        } else {
            self.ensure_idle_target(state, dom.housekeeping)?;
            (shared.idle_space, dom.housekeeping)
        };
        let request = IpiRequest {
            hw: &shared.hw,
            domain: file.domain,
            rmid: file.rmid,
            event: file.event,
            status: AtomicU64::new(1),
            value: AtomicU64::new(0),
        };
        // SAFETY: (1) `ipi_mon_event_count` is async-signal-safe: it calls
        // `Hardware::rmid_read`, which only loads and stores atomics and reads immutable
        // slices, and stores its result into atomics; (2) `request` lives on this stack frame
        // until `call_on` returns, which is after the call ran or was withdrawn.
        let report = unsafe {
            cross_call::call_on(
                space,
                cpu,
                ipi_mon_event_count,
                &request as *const IpiRequest<'_> as *const (),
                shared.call_timeout,
            )
        }?;
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
        ))
    }

    /// Starts the idle stand-in of `cpu` if it has none: a thread pinned there, asleep, for
    /// the interrupt path to interrupt when no registered thread runs in the domain.
    fn ensure_idle_target(
        &self,
        _locked: &MutexGuard<'_, RdtState>,
        cpu: usize,
    ) -> Result<(), ResctrlError> {
        if cross_call::has_target(self.shared.idle_space, cpu) {
            return Ok(());
        }
        // `_locked` proves rdtgroup_mutex is held: the check above and the start below are
        // one step, so a CPU never gets two stand-ins.
        let phys = self.qpw.physical_cpu(cpu)?;
        let stop = Arc::new(AtomicBool::new(false));
        let ready = Arc::new(AtomicBool::new(false));
        let (s, r, space) = (stop.clone(), ready.clone(), self.shared.idle_space);
        let handle = thread::Builder::new()
            .name(format!("resctrl-idle/{cpu}"))
            .spawn(move || idle_stand_in(space, cpu, phys, &s, &r))
            .map_err(|source| ResctrlError::Spawn {
                what: "idle stand-in",
                source,
            })?;
        while !ready.load(Ordering::Acquire) {
            thread::yield_now();
        }
        lock(&self.shared.idle).push((stop, handle));
        Ok(())
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

/// The handler side of path 2 (`mon_event_count` in IPI context): async-signal-safe.
fn ipi_mon_event_count(ctx: &CallCtx, arg: *const ()) {
    // SAFETY: `smp_call_function_single` passes a pointer to an `IpiRequest` that outlives
    // the call (it waits for the call before returning).
    let req = unsafe { &*(arg as *const IpiRequest<'_>) };
    // Where the handler executes, as the hardware sees it: the physical CPU it interrupted,
    // or for logical layouts the CPU the interrupted thread is registered for.
    let on = if req.hw.logical {
        Some(ctx.cpu())
    } else {
        ctx.phys_cpu()
    };
    let (status, value) = req
        .hw
        .rmid_read(on, req.domain, req.rmid, req.event)
        .encode();
    req.value.store(value, Ordering::Relaxed);
    req.status.store(status, Ordering::Release);
}

fn idle_stand_in(space: u64, cpu: usize, phys: usize, stop: &AtomicBool, ready: &AtomicBool) {
    let _ = qpw_core::pin_current_thread(phys);
    let target = CallTarget::register(space, cpu);
    ready.store(true, Ordering::Release);
    let Ok(_target) = target else {
        return;
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
