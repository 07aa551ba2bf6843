//! Reading a counter file (`rdtgroup_mondata_show`): `rdtgroup_mutex` held across the read,
//! dispatched by the read path; read path 3, the local fast path; the hardware rule.

use std::time::{Duration, Instant};

use qpw_core::sync::{MutexGuard, Ordering};

use super::error::ResctrlError;
use super::file::MonFile;
use super::groups::RdtState;
use super::hardware::Executing;
use super::model::{lock, Resctrl};
use super::read_path::ReadPath;
use super::value::{Executor, MonRead, ReadValue};

/// A read as executed: the value, who executed it, and how long the reader waited for its
/// executor when that was another thread.
pub(super) type Executed = (ReadValue, Executor, Option<Duration>);

impl Resctrl {
    /// The read path the switch is set to.
    pub fn read_path(&self) -> ReadPath {
        ReadPath::ALL[self.path.load(Ordering::Relaxed) % 4]
    }

    /// Sets the switch.
    pub fn set_read_path(&self, path: ReadPath) {
        self.path.store(path.idx(), Ordering::Relaxed);
    }

    /// Reads a counter file by the current path (`rdtgroup_mondata_show`).
    pub fn read(&self, file: &MonFile) -> Result<MonRead, ResctrlError> {
        self.read_with(file, self.read_path())
    }

    /// Reads a counter file by `path`, holding `rdtgroup_mutex` across the read and recording
    /// the hold in that path's [`HoldStats`](super::HoldStats).
    pub fn read_with(&self, file: &MonFile, path: ReadPath) -> Result<MonRead, ResctrlError> {
        // A failed trylock is a wait for the mutex (the overflow worker or another reader
        // holds it), which the record counts apart from the hold itself.
        let (mut state, waited_for_mutex) = match self.shared.rdtgroup_mutex.try_lock() {
            Ok(state) => (state, false),
            Err(_) => (lock(&self.shared.rdtgroup_mutex), true),
        };
        let start = Instant::now();
        let outcome = self.read_locked(&state, file, path);
        let hold = start.elapsed();
        state.stats[path.idx()].record(hold, waited_for_mutex, outcome.as_ref().ok());
        drop(state);
        outcome
    }

    fn read_locked(
        &self,
        state: &MutexGuard<'_, RdtState>,
        file: &MonFile,
        path: ReadPath,
    ) -> Result<MonRead, ResctrlError> {
        if !state.alive(file) {
            return Err(ResctrlError::GroupRemoved {
                path: file.path.clone(),
            });
        }
        let plain = |(value, executor, waited)| MonRead {
            value,
            executor,
            rate: None,
            age: None,
            waited,
        };
        match path {
            ReadPath::Workqueue => self.mon_event_read_queued(state, file).map(plain),
            ReadPath::Local => match self.reader_cpu_in(file.domain) {
                Some(cpu) => {
                    self.shared
                        .counts
                        .reader_direct
                        .fetch_add(1, Ordering::Relaxed);
                    Ok(plain(self.mon_event_count_here(file, cpu)))
                }
                None => {
                    self.shared
                        .counts
                        .local_fallbacks
                        .fetch_add(1, Ordering::Relaxed);
                    self.mon_event_read_queued(state, file).map(plain)
                }
            },
            ReadPath::Interrupt => self.smp_call_function_single(state, file).map(plain),
            ReadPath::Cached => Ok(self.read_cached(file)),
        }
    }

    /// The reader's CPU if it is pinned to one CPU of `domain` (bound with
    /// [`Qpw::bind_current`], or a physical layout's thread whose affinity is that one CPU):
    /// only then can it not leave the domain between the check and the read (the kernel's
    /// `get_cpu()`).
    pub(super) fn reader_cpu_in(&self, domain: usize) -> Option<usize> {
        let cpu = if self.qpw.is_logical() {
            self.qpw.current_cpu()?
        } else {
            let affinity = qpw_core::current_affinity().ok()?;
            if affinity.len() != 1 {
                return None;
            }
            affinity.first()?
        };
        self.shared.domains[domain]
            .cpus
            .contains(cpu)
            .then_some(cpu)
    }

    /// Where the calling thread executes, as the hardware sees it: the CPU of the model it
    /// belongs to (its binding, or for physical layouts the CPU it runs on) and the physical
    /// CPU it runs on now.
    fn executing(&self) -> Option<Executing> {
        self.qpw.current_cpu().map(Executing::now)
    }

    pub(super) fn mon_event_count_here(&self, file: &MonFile, cpu: usize) -> Executed {
        let value = self
            .shared
            .hw
            .rmid_read(self.executing(), file.domain, file.rmid, file.event);
        (value, Executor::Reader { cpu }, None)
    }

    /// `resctrl_arch_rmid_read` on the calling thread, as it runs now, under `rdtgroup_mutex`:
    /// what a read path must never do from outside the domain. Returns
    /// [`ReadValue::Error`] and counts a violation when the thread is not on a CPU of the
    /// file's domain.
    pub fn arch_rmid_read(&self, file: &MonFile) -> ReadValue {
        let _state = lock(&self.shared.rdtgroup_mutex);
        self.shared
            .hw
            .rmid_read(self.executing(), file.domain, file.rmid, file.event)
    }

    /// Reads that executed outside their counter's domain (should stay 0).
    pub fn violations(&self) -> u64 {
        self.shared.hw.violations.load(Ordering::Relaxed)
    }
}
