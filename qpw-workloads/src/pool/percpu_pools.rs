//! Design 3: per-CPU pools with lock-free return to the owning CPU (Mathieu Desnoyers).

use std::fmt;

use qpw_core::sync::{AtomicUsize, Ordering};
use qpw_core::{PerCpu, PerCpuGuard, Qpw};

use super::buffer_pool::{Buffer, BufferPool, PoolStats};
use super::counters::Counter;
use super::design::Design;
use super::error::{check, PoolError};
use super::slab::Slab;

/// End of a return stack.
const NIL: usize = usize::MAX;

/// One CPU's return stack head, on its own cache line.
#[repr(align(128))]
#[derive(Debug)]
struct ReturnHead(AtomicUsize);

/// Design 3: per-CPU pools of `per_cpu` buffers each, owned for life by one CPU; a buffer put
/// on another CPU is pushed lock-free onto its owner's return stack (Desnoyers).
pub struct PerCpuPools {
    slab: Slab,
    qpw_cpus: Vec<usize>,
    /// Per buffer: the index of its owning CPU.
    home: Box<[usize]>,
    /// Per buffer: the next buffer on a return stack.
    next: Box<[AtomicUsize]>,
    /// Per CPU: the head of its return stack.
    returns: Box<[ReturnHead]>,
    local: PerCpu<Vec<u32>>,
    per_cpu: usize,
}

impl fmt::Debug for PerCpuPools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerCpuPools")
            .field("slab", &self.slab)
            .field("per_cpu", &self.per_cpu)
            .finish_non_exhaustive()
    }
}

impl PerCpuPools {
    /// Per-CPU pools of `per_cpu` buffers of `size` bytes for every CPU of `qpw`, all
    /// allocated now: the pool never holds more than `cpus x per_cpu`.
    pub fn new(qpw: &Qpw, size: usize, per_cpu: usize) -> Result<Self, PoolError> {
        check("buffer size", size, 1, 1 << 20)?;
        check("buffers per CPU", per_cpu, 1, 1 << 16)?;
        let cpus: Vec<usize> = qpw.cpus().iter().collect();
        let capacity = cpus.len() * per_cpu;
        check("total buffers", capacity, 1, 1 << 20)?;
        let slab = Slab::new(size, capacity);
        let mut home = Vec::with_capacity(capacity);
        let mut lists: Vec<Vec<u32>> = vec![Vec::with_capacity(per_cpu); cpus.len()];
        for (idx, list) in lists.iter_mut().enumerate() {
            for _ in 0..per_cpu {
                let id = slab.alloc().ok_or(PoolError::Range {
                    what: "total buffers",
                    value: capacity,
                    lo: 1,
                    hi: 1 << 20,
                })?;
                home.push(idx);
                list.push(id);
            }
        }
        let mut lists = lists.into_iter();
        let local = qpw.per_cpu(|_| lists.next().unwrap_or_default());
        Ok(Self {
            slab,
            home: home.into(),
            next: (0..capacity).map(|_| AtomicUsize::new(NIL)).collect(),
            returns: cpus
                .iter()
                .map(|_| ReturnHead(AtomicUsize::new(NIL)))
                .collect(),
            qpw_cpus: cpus,
            local,
            per_cpu,
        })
    }

    fn idx_of(&self, cpu: usize) -> usize {
        self.qpw_cpus.iter().position(|&c| c == cpu).unwrap_or(0)
    }

    /// Takes this CPU's whole return stack back into its list (one swap), walking the links.
    fn reclaim(&self, idx: usize, list: &mut Vec<u32>) {
        let mut id = self.returns[idx].0.swap(NIL, Ordering::Acquire);
        while id != NIL {
            list.push(id as u32);
            id = self.next[id].load(Ordering::Relaxed);
        }
    }

    /// Pushes `id` onto the return stack of CPU index `idx`, lock-free.
    fn push_return(&self, idx: usize, id: u32) {
        let head = &self.returns[idx].0;
        let mut old = head.load(Ordering::Relaxed);
        loop {
            self.next[id as usize].store(old, Ordering::Relaxed);
            match head.compare_exchange_weak(old, id as usize, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => {
                    self.slab.count(Counter::CasRetries);
                    old = now;
                }
            }
        }
    }

    pub(super) fn lock_local(&self) -> Result<PerCpuGuard<'_, Vec<u32>>, PoolError> {
        Ok(match self.local.try_lock_local()? {
            Some(guard) => guard,
            None => {
                self.slab.count(Counter::PercpuWaits);
                self.local.lock_local()?
            }
        })
    }
}

impl BufferPool for PerCpuPools {
    fn design(&self) -> Design {
        Design::PerCpuPools
    }

    fn get(&self) -> Result<Option<Buffer>, PoolError> {
        let mut list = self.lock_local()?;
        if list.is_empty() {
            // Dry: take back what other CPUs returned.
            let idx = self.idx_of(PerCpuGuard::cpu(&list));
            self.reclaim(idx, &mut list);
        }
        match list.pop() {
            Some(id) => {
                drop(list);
                self.slab.count(Counter::LocalHits);
                Ok(Some(self.slab.take(id)))
            }
            None => {
                self.slab.count(Counter::Exhausted);
                Ok(None)
            }
        }
    }

    fn put(&self, buffer: Buffer) -> Result<(), PoolError> {
        let id = self.slab.give(buffer)?;
        let home = self.home[id as usize];
        let mut list = self.lock_local()?;
        if self.idx_of(PerCpuGuard::cpu(&list)) == home {
            list.push(id);
            return Ok(());
        }
        drop(list);
        // Freed on another CPU: back to the owner, lock-free.
        self.slab.count(Counter::RemoteReturns);
        self.push_return(home, id);
        Ok(())
    }

    fn stats(&self) -> PoolStats {
        self.slab.stats(Design::PerCpuPools)
    }

    fn check_conservation(&self) -> Result<(), String> {
        let mut places = Vec::new();
        let mut wrong_home = None;
        self.local.for_each_locked(|cpu, list| {
            let idx = self.idx_of(cpu);
            if let Some(&id) = list.iter().find(|&&id| self.home[id as usize] != idx) {
                wrong_home = Some((id, cpu));
            }
            places.push((format!("cpu {cpu}'s pool"), list.clone()));
        });
        if let Some((id, cpu)) = wrong_home {
            return Err(format!(
                "buffer {id} sits in cpu {cpu}'s pool, not its owner's"
            ));
        }
        for (idx, head) in self.returns.iter().enumerate() {
            let mut ids = Vec::new();
            let mut id = head.0.load(Ordering::Acquire);
            while id != NIL {
                if ids.len() > self.next.len() {
                    return Err(format!("cpu index {idx}'s return stack has a cycle"));
                }
                if self.home[id] != idx {
                    return Err(format!(
                        "buffer {id} is on the return stack of a CPU not its owner"
                    ));
                }
                ids.push(id as u32);
                id = self.next[id].load(Ordering::Relaxed);
            }
            places.push((format!("cpu {}'s return stack", self.qpw_cpus[idx]), ids));
        }
        self.slab.check(places)
    }

    fn with_bytes(
        &self,
        buffer: &mut Buffer,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), PoolError> {
        self.slab.with_bytes(buffer, f)
    }
}
