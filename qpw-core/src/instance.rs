//! The framework instance: which CPUs it manages, each CPU's mode, the workers, and thread
//! binding.
//!
//! The mode of every CPU is fixed in [`Builder::build`], and everything that depends on it
//! ([`PerCpu`] state, [`PerCpuWork`] items) is created *from* the built instance. A lock can
//! therefore never be used in a mode other than the one it was made for: the kernel reviewers'
//! "initialise the locks after the mode is fixed" rule, made structural.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::path::PathBuf;

use crate::affinity;
use crate::gate::RunGate;
use crate::sync::thread_local;
use crate::work::WorkerPool;
use crate::{CpuSet, Error, Mode, PerCpu, PerCpuWork, Policy, Result, Topology, WorkCtx};

/// Which CPUs an instance manages.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CpuSpec {
    /// The CPUs the process may run on (`sched_getaffinity`).
    #[default]
    Allowed,
    /// These physical CPUs, each of which must be allowed.
    List(CpuSet),
    /// `n` logical CPUs `0..n`, multiplexed round-robin onto the allowed physical CPUs: logical
    /// CPU `i` runs on the `i % m`-th allowed CPU. For scale experiments (128 CPUs on a small
    /// machine); reports must say so, and [`Qpw::describe`] does.
    Logical(usize),
}

/// Builds a [`Qpw`] instance.
///
/// ```
/// use qpw_core::{CpuSpec, Policy, Qpw};
///
/// let qpw = Qpw::builder()
///     .cpus(CpuSpec::Logical(4))
///     .policy(Policy::RemoteOn("3".parse()?))
///     .build()?;
/// assert_eq!(qpw.cpus().to_string(), "0-3");
/// assert_eq!(qpw.mode(3)?, qpw_core::Mode::Remote);
/// assert_eq!(qpw.mode(0)?, qpw_core::Mode::Queue);
/// # Ok::<(), qpw_core::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Builder {
    cpus: CpuSpec,
    policy: Policy,
    topology: Option<Topology>,
    sysfs_root: Option<PathBuf>,
    worker_priority: Option<i32>,
    declared_isolated: CpuSet,
}

impl Builder {
    /// Which CPUs to manage (default: the allowed ones).
    pub fn cpus(mut self, cpus: CpuSpec) -> Self {
        self.cpus = cpus;
        self
    }

    /// How to choose each CPU's mode (default: [`Policy::Auto`], the kernel's rule: remote on
    /// the isolated and `nohz_full` CPUs, queue elsewhere, queue everywhere without
    /// isolation). An explicit policy always wins. A [`Policy::RemoteOn`] or
    /// [`Policy::FencedOn`] list must name managed CPUs only: [`build`](Self::build) refuses
    /// others with [`Error::PolicyCpuNotManaged`].
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The topology to take isolated CPUs from (default: read from `/sys` when the policy
    /// follows the isolation, [`Policy::Auto`] or [`Policy::Isolated`]; another policy ignores
    /// it).
    pub fn topology(mut self, topology: Topology) -> Self {
        self.topology = Some(topology);
        self
    }

    /// Treats these CPUs as isolated, besides those the kernel reports (`isolcpus=`,
    /// `nohz_full=`, run-time isolated cpuset partitions): for a service that knows which CPUs
    /// it keeps quiet, however the machine was set up. Only the policies that follow the
    /// isolation ([`Policy::Auto`], the default, and [`Policy::Isolated`]) look at it: they put
    /// these CPUs in remote mode. A CPU listed here that the instance does not manage is
    /// ignored.
    ///
    /// ```
    /// use qpw_core::{CpuSet, Mode, Qpw};
    ///
    /// let allowed = qpw_core::allowed_cpus()?;
    /// let quiet = allowed.iter().last().unwrap();
    /// let qpw = Qpw::builder().isolated(CpuSet::from_iter([quiet])).build()?;
    /// assert_eq!(qpw.mode(quiet)?, Mode::Remote);
    /// assert!(qpw.isolated().contains(quiet));
    /// # Ok::<(), qpw_core::Error>(())
    /// ```
    pub fn isolated(mut self, cpus: CpuSet) -> Self {
        self.declared_isolated = cpus;
        self
    }

    /// Reads the topology from this sysfs root instead of `/sys` (for tests with a fake tree),
    /// if the policy needs the topology at all: otherwise the root is not opened.
    pub fn sysfs_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.sysfs_root = Some(root.into());
        self
    }

    /// Runs the workers `SCHED_FIFO` at this priority (1-99); `build` fails with a clear error
    /// where that is not permitted.
    pub fn worker_priority(mut self, priority: i32) -> Self {
        self.worker_priority = Some(priority);
        self
    }

    /// Builds the instance: checks the CPUs, fixes every CPU's mode, and starts a worker on each
    /// queue-mode CPU.
    pub fn build(self) -> Result<Qpw> {
        if let Some(priority) = self.worker_priority {
            if !(1..=99).contains(&priority) {
                return Err(Error::PriorityOutOfRange { priority });
            }
        }
        let (managed, phys, logical) = self.managed_cpus()?;
        self.check_policy_cpus(&managed)?;
        let isolated = self.isolated_cpus()?;
        let modes = self.modes(&managed, &phys, logical, &isolated);
        let mut index = vec![usize::MAX; managed.last().map_or(0, |c| c + 1)];
        for (idx, cpu) in managed.iter().enumerate() {
            index[cpu] = idx;
        }

        let inner = crate::sync::Arc::new(Inner {
            id: crate::sync::next_instance_id(),
            managed,
            index,
            phys,
            modes,
            logical,
            policy: self.policy,
            isolated,
            workers: WorkerPool::new(self.worker_priority),
            gate: RunGate::new(),
        });
        // The handle first, so that an error below stops the workers started so far.
        let qpw = Qpw {
            handle: crate::sync::Arc::new(Handle { inner }),
        };
        // Start the workers of the queue-mode CPUs now, so that a permission error surfaces here.
        let inner = qpw.inner();
        for idx in 0..inner.modes.len() {
            if inner.modes[idx] == Mode::Queue {
                inner.worker(idx)?;
            }
        }
        Ok(qpw)
    }

    /// The managed CPUs, the physical CPU each runs on, and whether they are logical CPUs
    /// ([`CpuSpec::Logical`], spread round-robin over the allowed ones); refuses an empty set,
    /// a CPU the process may not run on and a logical count out of range.
    fn managed_cpus(&self) -> Result<(CpuSet, Vec<usize>, bool)> {
        let allowed = affinity::allowed_cpus()?;
        let (managed, phys, logical) = match &self.cpus {
            CpuSpec::Allowed => (allowed.clone(), allowed.as_slice().to_vec(), false),
            CpuSpec::List(list) => {
                if list.is_empty() {
                    return Err(Error::EmptyCpuSet);
                }
                if let Some(cpu) = list.iter().find(|&c| !allowed.contains(c)) {
                    return Err(Error::CpuNotAllowed { cpu, allowed });
                }
                (list.clone(), list.as_slice().to_vec(), false)
            }
            &CpuSpec::Logical(n) => {
                let max = CpuSet::MAX_CPU + 1;
                if n == 0 || n > max {
                    return Err(Error::LogicalCpuCount { count: n, max });
                }
                let phys = (0..n)
                    .map(|i| allowed.as_slice()[i % allowed.len()])
                    .collect();
                (CpuSet::first_n(n), phys, true)
            }
        };
        if managed.is_empty() {
            return Err(Error::EmptyCpuSet);
        }
        Ok((managed, phys, logical))
    }

    /// Refuses a policy whose list names a CPU the instance does not manage.
    fn check_policy_cpus(&self, managed: &CpuSet) -> Result<()> {
        if let Some(list) = self.policy.listed() {
            if let Some(cpu) = list.iter().find(|&c| !managed.contains(c)) {
                return Err(Error::PolicyCpuNotManaged {
                    policy: self.policy.to_string(),
                    cpu,
                    managed: managed.clone(),
                });
            }
        }
        Ok(())
    }

    /// The isolated CPUs, for the policies that follow the isolation: the topology's isolated
    /// and `nohz_full` CPUs and those declared so. Only those policies read the topology (a
    /// sysfs root given for another policy is not even opened); for the others, none.
    fn isolated_cpus(&self) -> Result<CpuSet> {
        if !self.policy.follows_isolation() {
            return Ok(CpuSet::default());
        }
        let read;
        let topology = match (&self.topology, &self.sysfs_root) {
            (Some(t), _) => t,
            (None, Some(root)) => {
                read = Topology::read_from(root)?;
                &read
            }
            (None, None) => {
                read = Topology::read()?;
                &read
            }
        };
        Ok(topology
            .isolated_or_nohz_full()
            .union(&self.declared_isolated))
    }

    /// Each managed CPU's mode under the policy. A logical CPU takes the isolation of the
    /// physical CPU it runs on; a policy's list names managed CPUs as they are numbered.
    fn modes(
        &self,
        managed: &CpuSet,
        phys: &[usize],
        logical: bool,
        isolated: &CpuSet,
    ) -> Vec<Mode> {
        phys.iter()
            .zip(managed.iter())
            .map(|(&p, id)| {
                let key = if logical { p } else { id };
                match self.policy.listed() {
                    Some(_) => self.policy.mode_of(id, isolated),
                    None => self.policy.mode_of(key, isolated),
                }
            })
            .collect()
    }
}

/// What the framework bound the calling thread to: an instance, one of its CPUs, and that
/// CPU's slot index (the same in every [`PerCpu`] of the instance, whose slots follow its
/// managed CPUs in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Registration {
    pub(crate) instance: u64,
    pub(crate) cpu: usize,
    pub(crate) idx: usize,
}

/// Where `lock_local` finds the calling thread's slot and takes its lock: the slot's index,
/// in units of [`SLOT_UNIT`] bytes, and the thread's rseq area for the owner's fast path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Here {
    /// The slot's index times [`SLOT_UNIT`]: a slot of `k` units is then at `k` times this
    /// from the first, which for the usual one-unit slot is this offset itself (no shift).
    pub(crate) scaled: usize,
    /// The area's address (a raw pointer, so that an `Option<Here>` is told by the
    /// registration's compare, not by a test of the pointer).
    area: *const u8,
}

/// The alignment of a cache-padded slot: every `CachePadded<T>` is a whole number of these
/// bytes long (128 on x86-64).
pub(crate) const SLOT_UNIT: usize = std::mem::align_of::<crossbeam_utils::CachePadded<()>>();

impl Here {
    /// Slot `idx`, for a thread that is not bound (where it runs now).
    #[inline]
    pub(crate) fn unbound(idx: usize) -> Here {
        Here {
            scaled: idx * SLOT_UNIT,
            area: crate::rseq::owner_area().as_ptr(),
        }
    }

    /// The slot's index.
    #[inline]
    pub(crate) fn idx(self) -> usize {
        self.scaled / SLOT_UNIT
    }

    /// The calling thread's rseq area.
    #[inline(always)]
    pub(crate) fn area(self) -> crate::rseq::Area {
        // SAFETY: a `Here` is made only on the calling thread, from its registration (whose
        // area `set_binding` took from `owner_area` on this thread) or from `owner_area`.
        unsafe { crate::rseq::Area::from_ptr(self.area) }
    }
}

/// The calling thread's registration as `lock_local`'s hot path reads it: one compare of the
/// instance and two loads, all relative to the thread pointer, with no `Option` to unpack and
/// no look-up of the rseq area.
#[derive(Debug, Clone, Copy)]
struct ThreadBinding {
    /// The instance, or 0 for none (instance ids start at 1: `sync::next_instance_id`).
    instance: u64,
    /// The slot index times [`SLOT_UNIT`] (`Here::scaled`).
    scaled: usize,
    /// The thread's area's address, looked up when it was bound (only read when `instance`
    /// is not 0).
    area: *const u8,
    cpu: usize,
}

impl ThreadBinding {
    const NONE: ThreadBinding = ThreadBinding {
        instance: 0,
        scaled: 0,
        area: std::ptr::null(),
        cpu: 0,
    };
}

#[cfg(not(loom))]
thread_local! {
    /// The calling thread's registration. A `const` initialiser and no destructor, so that
    /// reading it on `lock_local`'s hot path is a load relative to the thread pointer with no
    /// lazy-initialisation check.
    static BINDING: Cell<ThreadBinding> = const { Cell::new(ThreadBinding::NONE) };
}

#[cfg(loom)]
thread_local! {
    /// As above; loom's `thread_local!` takes no `const` initialiser.
    #[allow(clippy::missing_const_for_thread_local)]
    static BINDING: Cell<ThreadBinding> = Cell::new(ThreadBinding::NONE);
}

/// The calling thread's registration, if it is bound.
#[inline]
pub(crate) fn binding() -> Option<Registration> {
    let b = BINDING.with(Cell::get);
    (b.instance != 0).then_some(Registration {
        instance: b.instance,
        cpu: b.cpu,
        idx: b.scaled / SLOT_UNIT,
    })
}

/// Where the calling thread's slot is in the [`PerCpu`] state of instance `instance`, if the
/// thread is bound to one of its CPUs: `lock_local`'s hot path.
#[inline(always)]
pub(crate) fn bound_here(instance: u64) -> Option<Here> {
    let b = BINDING.with(Cell::get);
    (b.instance == instance).then_some(Here {
        scaled: b.scaled,
        area: b.area,
    })
}

/// Registers the calling thread as bound to `binding` (or to nothing), and returns what it was.
pub(crate) fn set_binding(binding: Option<Registration>) -> Option<Registration> {
    let before = self::binding();
    let now = match binding {
        Some(Registration { instance, cpu, idx }) => ThreadBinding {
            instance,
            scaled: idx * SLOT_UNIT,
            area: crate::rseq::owner_area().as_ptr(),
            cpu,
        },
        None => ThreadBinding::NONE,
    };
    BINDING.with(|b| b.set(now));
    before
}

/// One live [`Binding`] of the calling thread.
#[derive(Debug, Clone)]
struct Bound {
    /// The binding's number, unique in the thread.
    id: u64,
    instance: u64,
    cpu: usize,
    idx: usize,
    phys: usize,
}

/// The calling thread's live bindings, oldest first, and what it was before the first: the
/// newest binding is the one in force, whatever order they are dropped in.
#[derive(Debug, Default)]
struct BindStack {
    live: Vec<Bound>,
    /// The registration and affinity before the first live binding.
    base: Option<(Option<Registration>, CpuSet)>,
    next_id: u64,
}

thread_local! {
    static BINDINGS: std::cell::RefCell<BindStack> = std::cell::RefCell::new(BindStack::default());
}

/// What every handle of an instance shares.
pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) managed: CpuSet,
    /// CPU id to slot index (`usize::MAX`: not managed).
    index: Vec<usize>,
    /// Slot index to the physical CPU its threads run on.
    pub(crate) phys: Vec<usize>,
    /// Slot index to mode.
    pub(crate) modes: Vec<Mode>,
    pub(crate) logical: bool,
    policy: Policy,
    isolated: CpuSet,
    pub(crate) workers: WorkerPool,
    /// What remote runs pass through: closed by a shutdown.
    pub(crate) gate: RunGate,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qpw")
            .field("id", &self.id)
            .field("cpus", &self.managed)
            .field("logical", &self.logical)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// The slot index of `cpu`, or the error naming the managed set.
    #[inline]
    pub(crate) fn idx(&self, cpu: usize) -> Result<usize> {
        match self.index.get(cpu) {
            Some(&idx) if idx != usize::MAX => Ok(idx),
            _ => Err(self.not_managed(cpu)),
        }
    }

    #[cold]
    fn not_managed(&self, cpu: usize) -> Error {
        Error::CpuNotManaged {
            cpu,
            managed: self.managed.clone(),
        }
    }

    /// The CPU of this instance the calling thread belongs to: its binding, or for physical
    /// instances the CPU it runs on now (read from the rseq area where glibc registered one,
    /// else `sched_getcpu`).
    #[inline]
    pub(crate) fn current_cpu(&self) -> Option<usize> {
        if let Some(bound) = binding() {
            if bound.instance == self.id {
                return Some(bound.cpu);
            }
        }
        if self.logical {
            return None;
        }
        crate::rseq::cpu_now().filter(|&c| matches!(self.index.get(c), Some(&i) if i != usize::MAX))
    }

    /// The error for a thread whose CPU this instance cannot use as "the caller's CPU": it
    /// runs on an unmanaged CPU (physical instances), or its CPU cannot be told.
    #[cold]
    pub(crate) fn caller_error(&self) -> Error {
        match affinity::current_cpu() {
            Some(cpu) if !self.logical => Error::CallerNotManaged {
                cpu,
                managed: self.managed.clone(),
            },
            _ => Error::Unbound {
                managed: self.managed.clone(),
            },
        }
    }

    /// See [`Qpw::bind_current`].
    pub(crate) fn bind_current(&self, cpu: usize) -> Result<Binding> {
        let idx = self.idx(cpu)?;
        let phys = self.phys[idx];
        let before = affinity::current_affinity()?;
        affinity::set_current_affinity(&CpuSet::from_iter([phys]))?;
        let id = BINDINGS.with(|stack| {
            let mut stack = stack.borrow_mut();
            if stack.live.is_empty() {
                stack.base = Some((binding(), before));
            }
            stack.next_id += 1;
            let id = stack.next_id;
            stack.live.push(Bound {
                id,
                instance: self.id,
                cpu,
                idx,
                phys,
            });
            id
        });
        set_binding(Some(Registration {
            instance: self.id,
            cpu,
            idx,
        }));
        #[cfg(loom)]
        crate::rseq::mock::migrate_to(Some(phys));
        Ok(Binding {
            id,
            instance: self.id,
            cpu,
            poller: crate::rseq_lock::Poller::for_cpu(phys),
            _not_send: PhantomData,
        })
    }

    /// Stops the instance: refuses new work in every mode, stops the workers and closes the
    /// mailboxes. With `wait`, also waits for the workers to finish their queues (except the
    /// calling thread's own worker) and for the remote runs in flight (except those the
    /// calling thread is inside), and reports what ran.
    fn stop(&self, wait: bool) -> ShutdownReport {
        self.gate.close();
        let report = self.workers.shutdown(wait);
        if wait {
            self.gate.wait_idle();
        }
        report
    }

    /// The worker of slot `idx`, started on first use.
    pub(crate) fn worker(&self, idx: usize) -> Result<crate::sync::Arc<crate::work::Worker>> {
        let cpu = self.managed.as_slice()[idx];
        self.workers
            .get(self.id, idx, cpu, self.phys[idx], self.modes.len())
    }
}

/// A framework instance: the managed CPUs, their modes, and the workers of the queue-mode
/// CPUs. A handle: clones are cheap and share the instance.
///
/// [`Qpw::shutdown`], or dropping the last handle, stops the instance: work queued from then
/// on is refused with [`Error::ShutDown`] in every mode, the workers exit once they have run
/// every item already queued, and the mailboxes of its owner-only state close.
/// `shutdown` waits for that; the drop does not (see the crate's "Lifecycle and failure"
/// section for why). [`PerCpu`] state and [`PerCpuWork`] items keep what they need alive, but
/// not the instance running.
#[derive(Clone)]
pub struct Qpw {
    handle: crate::sync::Arc<Handle>,
}

/// The instance as its handles hold it: the last one dropped stops it.
struct Handle {
    inner: crate::sync::Arc<Inner>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // Never waits: the dropping thread may hold a lock that queued work needs, or be one
        // of the workers (issue 13, cases 5 and 6). The workers finish their queues alone, and
        // a panic no flush collected is printed when its item is dropped (crate docs).
        let _ = self.inner.stop(false);
    }
}

impl fmt::Debug for Qpw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner().fmt(f)
    }
}

impl Qpw {
    #[inline]
    fn inner(&self) -> &crate::sync::Arc<Inner> {
        &self.handle.inner
    }

    /// A builder, for CPU sets and policies other than the defaults.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// An instance over the allowed CPUs, each CPU's mode chosen by the kernel's rule
    /// ([`Policy::Auto`]): remote mode on the isolated and `nohz_full` CPUs, queue mode on the
    /// others, queue mode everywhere on a machine without isolation. Reads `/sys`.
    pub fn new() -> Result<Self> {
        Self::builder().build()
    }

    /// An instance over the allowed CPUs with an explicit `policy`, which always wins over
    /// the kernel's rule.
    pub fn with_policy(policy: Policy) -> Result<Self> {
        Self::builder().policy(policy).build()
    }

    /// The managed CPUs.
    pub fn cpus(&self) -> &CpuSet {
        &self.inner().managed
    }

    /// Whether the CPUs are logical ones multiplexed onto fewer physical CPUs.
    pub fn is_logical(&self) -> bool {
        self.inner().logical
    }

    /// The policy the modes were chosen by.
    pub fn policy(&self) -> &Policy {
        &self.inner().policy
    }

    /// The CPUs the policy treated as isolated.
    pub fn isolated(&self) -> &CpuSet {
        &self.inner().isolated
    }

    /// The mode of `cpu`.
    pub fn mode(&self, cpu: usize) -> Result<Mode> {
        Ok(self.inner().modes[self.inner().idx(cpu)?])
    }

    /// The managed CPUs in `mode`.
    pub fn cpus_in(&self, mode: Mode) -> CpuSet {
        self.inner()
            .managed
            .iter()
            .zip(&self.inner().modes)
            .filter(|&(_, &m)| m == mode)
            .map(|(c, _)| c)
            .collect()
    }

    /// The physical CPU that `cpu`'s threads run on (itself, unless the CPUs are logical).
    pub fn physical_cpu(&self, cpu: usize) -> Result<usize> {
        Ok(self.inner().phys[self.inner().idx(cpu)?])
    }

    /// The kernel's `pw_is_cpu_remote(cpu)`: true when `cpu` is in remote (or fenced) mode and
    /// the caller is not one of its threads, i.e. when work for it would run here, on another
    /// CPU. Inside a run, the same answer as [`WorkCtx::is_remote`].
    /// [`Error::CpuNotManaged`] for a CPU the instance does not manage.
    pub fn is_cpu_remote(&self, cpu: usize) -> Result<bool> {
        Ok(self.mode(cpu)?.is_remote() && self.inner().current_cpu() != Some(cpu))
    }

    /// The CPU of this instance that the calling thread belongs to, if it can be told.
    pub fn current_cpu(&self) -> Option<usize> {
        self.inner().current_cpu()
    }

    /// A one-line description for reports, saying whether the CPUs are physical or logical,
    /// which mode each has and which rule chose it (the kernel's rule by default, or the
    /// explicit policy), where an unbound thread's CPU is read from (the rseq area or
    /// `sched_getcpu`), and which protocol [`RseqLock`](crate::RseqLock) uses in this process
    /// (`rseq`, or the `fair` fallback; [`rseq::status`](crate::rseq::status) says why).
    ///
    /// ```
    /// use qpw_core::{FakeSysfs, Mode, Qpw};
    ///
    /// // A fake sysfs in which this machine's last allowed CPU runs `nohz_full`.
    /// let allowed = qpw_core::allowed_cpus()?;
    /// let last = allowed.last().unwrap();
    /// let root = std::env::temp_dir().join(format!("qpw-describe-{}", std::process::id()));
    /// FakeSysfs::new(&allowed.to_string()).nohz_full(&last.to_string()).write(&root)?;
    /// let qpw = Qpw::builder().sysfs_root(&root).build()?; // no policy: the kernel's rule
    /// # std::fs::remove_dir_all(&root).ok();
    /// assert_eq!(qpw.mode(last)?, Mode::Remote);
    /// let text = qpw.describe();
    /// assert!(text.contains("policy auto (the default: the kernel's rule)"), "{text}");
    /// assert!(text.contains(&format!("remote on {last} (isolated or nohz_full)")), "{text}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn describe(&self) -> String {
        let queue = self.cpus_in(Mode::Queue);
        let remote = self.cpus_in(Mode::Remote);
        let fenced = self.cpus_in(Mode::Fenced);
        let policy = &self.inner().policy;
        let origin = if policy.is_explicit() {
            "explicit"
        } else {
            "the default: the kernel's rule"
        };
        let any_remote = !remote.is_empty() || !fenced.is_empty();
        let clause = |mode: Mode, set: &CpuSet| {
            if set.is_empty() {
                format!("{mode} on {set}")
            } else {
                let why = policy.reason(mode, any_remote);
                format!("{mode} on {set} ({why})")
            }
        };
        // The fenced CPUs only when there are some, with the protocol their locks use.
        let fenced_clause = if fenced.is_empty() {
            String::new()
        } else {
            let lock = match crate::FencedLock::kind() {
                crate::LocalLockKind::Rseq => "restartable sequences, fenced by membarrier",
                _ => "the atomic fallback, as remote mode: no rseq fence here",
            };
            format!(", {} with locks on {lock}", clause(Mode::Fenced, &fenced))
        };
        let kind = if self.inner().logical {
            let phys: CpuSet = self.inner().phys.iter().copied().collect();
            format!(
                "{} logical CPUs multiplexed onto physical CPUs {phys}",
                self.inner().managed.len()
            )
        } else {
            format!("physical CPUs {}", self.inner().managed)
        };
        let cpu_source = if crate::rseq::available() {
            "rseq cpu_id"
        } else {
            "sched_getcpu"
        };
        format!(
            "{kind}; policy {policy} ({origin}): {}, {}{fenced_clause}; unbound threads' CPU \
             from {cpu_source}; RseqLock uses {}; PerCid ids from {}{}",
            clause(Mode::Queue, &queue),
            clause(Mode::Remote, &remote),
            crate::RseqLock::kind(),
            crate::cid::source(),
            crate::cid::unavailable_reason()
                .map(|why| format!(" ({why})"))
                .unwrap_or_default()
        )
    }

    /// The first CPU whose lock other CPUs may take (remote or fenced mode), with its mode: the
    /// CPU that refuses a lock made only for its own CPU's threads.
    fn first_remote_cpu(&self) -> Option<(usize, Mode)> {
        self.inner()
            .managed
            .iter()
            .zip(self.inner().modes.iter().copied())
            .find(|&(_, m)| m.is_remote())
    }

    /// Pins the calling thread to `cpu`'s physical CPU and registers it as a thread of `cpu`, so
    /// that [`PerCpu::lock_local`] and the queue-mode [`PerCpu::lock`] know where it belongs.
    /// Dropping the returned [`Binding`] restores the previous affinity and registration.
    pub fn bind_current(&self, cpu: usize) -> Result<Binding> {
        self.inner().bind_current(cpu)
    }

    /// Per-CPU state for thread-per-core: each CPU's slot belongs to the one thread that
    /// [claims](crate::OwnedPerCpu::claim) it, which reaches it with no lock word at all and
    /// runs the work queued to its CPU itself when it polls (see [`OwnedPerCpu`](crate::OwnedPerCpu)).
    /// Refused with [`Error::LockNeedsQueueMode`] when any CPU is in remote or fenced mode:
    /// there is no lock for another CPU to take.
    pub fn owned_per_cpu<T>(&self, init: impl FnMut(usize) -> T) -> Result<crate::OwnedPerCpu<T>> {
        if let Some((cpu, mode)) = self.first_remote_cpu() {
            return Err(Error::LockNeedsQueueMode {
                cpu,
                mode,
                lock: "owner-only",
            });
        }
        Ok(crate::OwnedPerCpu::new(self.inner().clone(), init))
    }

    /// State per concurrency id (rseq's `mm_cid`): one slot for each id the process's threads
    /// run with, made on first use from `init`, each behind its own lock
    /// ([`PerCid`](crate::PerCid)). Where `mm_cid` cannot be read the ids are CPU numbers
    /// ([`cid::status`](crate::cid::status) says why; [`describe`](Self::describe) says which).
    /// Every walk runs in the caller, whatever this instance's policy: an id is not a CPU a
    /// worker could run on.
    ///
    /// ```
    /// let qpw = qpw_core::Qpw::new()?;
    /// let hits = qpw.per_cid(|_id| 0u64);
    /// *hits.lock_local()? += 1;
    /// assert_eq!(hits.take_each(std::mem::take)?.iter().map(|(_, n)| n).sum::<u64>(), 1);
    /// # Ok::<(), qpw_core::Error>(())
    /// ```
    pub fn per_cid<T>(
        &self,
        init: impl Fn(usize) -> T + Send + Sync + 'static,
    ) -> crate::PerCid<T> {
        crate::PerCid::new(init)
    }

    /// Per-CPU state, one slot per managed CPU, initialised with `init(cpu)`, each behind that
    /// CPU's [`PwLock`](crate::PwLock) (the kernel's `DEFINE_PER_CPU` plus `pw_lock_init`): a
    /// [`FairLock`](crate::FairLock) on queue- and remote-mode CPUs, a
    /// [`FencedLock`](crate::FencedLock) on fenced-mode ones.
    pub fn per_cpu<T>(&self, init: impl FnMut(usize) -> T) -> PerCpu<T> {
        PerCpu::new(self.inner().clone(), init)
    }

    /// Like [`per_cpu`](Self::per_cpu), with the local lock `L` chosen by type: for example
    /// [`RseqLock`](crate::RseqLock), the restartable-sequence lock. A lock that only its own
    /// CPU's threads may take ([`RawLocalLock::OWN_CPU_ONLY`](crate::RawLocalLock::OWN_CPU_ONLY))
    /// is refused with [`Error::LockNeedsQueueMode`] when any CPU is in remote or fenced mode.
    ///
    /// ```
    /// use qpw_core::{FairLock, Policy, Qpw, RseqLock};
    ///
    /// let qpw = Qpw::with_policy(Policy::Queue)?;
    /// let fair = qpw.per_cpu_with::<FairLock, _>(|_| 0u32)?; // the same as `per_cpu`
    /// let rseq = qpw.per_cpu_with::<RseqLock, _>(|_| 0u32)?;
    /// *rseq.lock_local()? += 1;
    /// # drop(fair);
    /// # Ok::<(), qpw_core::Error>(())
    /// ```
    pub fn per_cpu_with<L: crate::RawLocalLock, T>(
        &self,
        init: impl FnMut(usize) -> T,
    ) -> Result<PerCpu<T, L>> {
        if L::OWN_CPU_ONLY {
            if let Some((cpu, mode)) = self.first_remote_cpu() {
                return Err(Error::LockNeedsQueueMode {
                    cpu,
                    mode,
                    lock: lock_name::<L>(),
                });
            }
        }
        Ok(PerCpu::new(self.inner().clone(), init))
    }

    /// A per-CPU work item (`struct pw_struct` on every CPU, `INIT_PW`): `func` runs once per
    /// [`PerCpuWork::queue_on`], for the CPU named in its [`WorkCtx`]. It reserves one place
    /// in each worker's queue, given back when its last handle is dropped.
    /// [`Error::ShutDown`] once the instance has stopped and a queue-mode CPU would need its
    /// worker.
    pub fn work<F>(&self, func: F) -> Result<PerCpuWork>
    where
        F: Fn(&WorkCtx) + Send + Sync + 'static,
    {
        PerCpuWork::new(
            self.inner().clone(),
            crate::sync::SharedFn::new(func),
            false,
        )
    }

    /// A per-CPU work item that must really run *on* its CPU, so it is queued to that CPU's
    /// worker in every mode (the kernel keeps the bh-LRU drain and SLUB's
    /// `flush_rcu_sheaves_on_cache` queued even with `pwlocks=1`). Starts workers on
    /// remote-mode CPUs if they have none yet.
    pub fn work_on_cpu<F>(&self, func: F) -> Result<PerCpuWork>
    where
        F: Fn(&WorkCtx) + Send + Sync + 'static,
    {
        PerCpuWork::new(self.inner().clone(), crate::sync::SharedFn::new(func), true)
    }

    /// Stops the instance, for every handle: work queued from now on is refused with
    /// [`Error::ShutDown`] in every mode; then waits until the workers have run every item
    /// already queued and exited, and until the remote runs already started have returned;
    /// closes the mailboxes of owner-only state ([`Qpw::owned_per_cpu`]; what waits there is
    /// left to the owners' next polls); and says what ran during the shutdown. A second call
    /// finds nothing left to stop.
    ///
    /// Called from inside a run of this instance (on a worker, or in a remote run), it does
    /// not wait for itself: not for the calling worker's own queue, which that worker
    /// finishes after the current item, nor for the remote runs the caller is inside. Like a
    /// flush, it waits for queued work that needs a lock the caller holds: release it first.
    pub fn shutdown(&self) -> ShutdownReport {
        self.inner().stop(true)
    }

    /// Whether [`shutdown`](Self::shutdown) has been called.
    pub fn is_shut_down(&self) -> bool {
        self.inner().gate.is_closed()
    }
}

/// A short name for a lock type, for error messages.
fn lock_name<L>() -> &'static str {
    let full = std::any::type_name::<L>();
    match full.rsplit("::").next() {
        Some("RseqLock") => "rseq",
        Some("FairLock") => "fair",
        Some(_) | None => full,
    }
}

/// What the workers did while the instance shut down.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use = "the report carries the panics of runs no flush collected"]
pub struct ShutdownReport {
    /// Work items that were still queued when the shutdown began and ran before the workers
    /// exited.
    pub ran: usize,
    /// The runs among those that panicked while no flush waited for them, by CPU, with their
    /// messages (a flush that waited reports its run's panic itself; no panic is reported
    /// twice).
    pub panicked: Vec<(usize, String)>,
    /// Work items waiting in the mailboxes of owner-only state
    /// ([`Qpw::owned_per_cpu`]) when the shutdown closed them: no worker runs those; each
    /// runs at its owner's next poll, and its flush waits for that.
    pub left_for_owners: usize,
}

/// The calling thread's registration with a CPU, from [`Qpw::bind_current`]. Not `Send`:
/// it belongs to the thread it binds.
///
/// A thread may hold several; the newest one alive is in force. Dropping the one in force
/// puts the thread back under the next newest (its CPU and pinning), or, when it was the last,
/// back as it was before the first (its registration and affinity); dropping an older one only
/// forgets it. So bindings may be dropped in any order.
///
/// A thread that owns a fenced-mode CPU and spends its time on something else (a socket, a
/// ring) calls [`poll`](Self::poll) in its loop, so that requesters need not fence the CPU.
#[must_use = "dropping the binding unbinds the thread at once"]
pub struct Binding {
    id: u64,
    /// The instance it binds to.
    pub(crate) instance: u64,
    /// The CPU it binds to.
    pub(crate) cpu: usize,
    /// The last call to the physical CPU this binding answered, and where to look for calls.
    poller: crate::rseq_lock::Poller,
    _not_send: PhantomData<*const ()>,
}

impl Binding {
    /// Answers the requesters that have called this CPU since the last poll, if any: what an
    /// owner's loop calls between its own operations when it spends its time polling
    /// something else (a socket, a ring, a device), as Seastar's reactor polls its cross-core
    /// queues between tasks.
    ///
    /// In [fenced mode](crate::Mode::Fenced) a requester on another CPU ([`PerCpu::lock`],
    /// [`PerCpu::take_each`], a [`drain_all`](crate::PerCpuWork::drain_all)) raises a flag on
    /// the CPU's lock and calls the CPU; its owner answers when it touches that lock, and
    /// otherwise the requester fences the CPU with `membarrier`, an interrupt here. An owner
    /// that is seldom in its locks answers through this call instead, and takes no interrupt.
    /// The answer is the CPU's: one poll answers for every fenced lock of the CPU, whatever
    /// state or instance it belongs to. The requester waits for it up to 2 us while the CPU
    /// answers, so poll at least that often; a requester whose wait went unanswered fences,
    /// and the next ones fence at once until an answer is seen again.
    ///
    /// **Cost.** When nobody has called the CPU since the last answer: one load of the CPU's
    /// call counter (a cache line shared with the requesters, written only when one calls),
    /// compared with the binding's own copy: about half a nanosecond, twice a bare relaxed load
    /// in a tight loop (`docs/results.md`, section 6f). When a requester has called: a restartable sequence that reads the call
    /// on this CPU, and a store of it for the requester to see. On a CPU in another mode, or
    /// where restartable sequences are unavailable, nobody calls, and it always returns
    /// [`Polled::Quiet`](crate::Polled::Quiet). Exclusion never depends on it: a poll that
    /// does not come costs the requester a fence, no more (the argument is in
    /// [`fenced_lock`](crate::fenced_lock)).
    ///
    /// [`Polled::Elsewhere`](crate::Polled::Elsewhere) when a requester called but the thread
    /// does not run on its binding's CPU now (its pinning was undone, or a newer binding is in
    /// force): only a thread running there can answer.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use qpw_core::{Policy, Qpw};
    ///
    /// let qpw = Qpw::with_policy(Policy::Fenced)?;
    /// let requests = qpw.per_cpu(|_cpu| 0u64);
    /// let cpu = qpw.cpus().first().unwrap();
    /// let done = AtomicBool::new(false);
    /// let (taken, served) = std::thread::scope(|s| {
    ///     // A scrape, from wherever the scheduler runs it: it raises each fenced CPU's flag
    ///     // and calls the CPU; the owner below answers from its loop.
    ///     let scrape = s.spawn(|| {
    ///         let taken = requests.take_each(|_cpu, n| std::mem::take(n));
    ///         done.store(true, Ordering::Release);
    ///         taken.iter().map(|(_, n)| n).sum::<u64>()
    ///     });
    ///     // The owner: pinned to its CPU, busy with something else (here, watching `done`).
    ///     let binding = qpw.bind_current(cpu)?;
    ///     let mine = requests.bound_slot(&binding)?;
    ///     let mut served = 0;
    ///     while !done.load(Ordering::Acquire) {
    ///         *mine.lock() += 1; // a request served
    ///         served += 1;
    ///         binding.poll(); // one load, unless a requester has called: then the answer
    ///     }
    ///     Ok::<_, qpw_core::Error>((scrape.join().unwrap(), served))
    /// })?;
    /// assert_eq!(taken + *requests.lock(cpu)?, served); // nothing lost, nothing twice
    /// # Ok::<(), qpw_core::Error>(())
    /// ```
    #[inline]
    pub fn poll(&self) -> crate::Polled {
        self.poller.poll()
    }
}

impl fmt::Debug for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Binding").field("cpu", &self.cpu).finish()
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        BINDINGS.with(|stack| {
            let mut stack = stack.borrow_mut();
            let Some(pos) = stack.live.iter().position(|b| b.id == self.id) else {
                return;
            };
            let was_in_force = pos + 1 == stack.live.len();
            stack.live.remove(pos);
            if !was_in_force {
                return;
            }
            // The mask restored was valid when it was read; if the system has changed since,
            // the thread simply stays pinned, which is safe.
            match stack.live.last() {
                Some(top) => {
                    set_binding(Some(Registration {
                        instance: top.instance,
                        cpu: top.cpu,
                        idx: top.idx,
                    }));
                    let _ = affinity::set_current_affinity(&CpuSet::from_iter([top.phys]));
                    #[cfg(loom)]
                    crate::rseq::mock::migrate_to(Some(top.phys));
                }
                None => {
                    if let Some((registration, mask)) = stack.base.take() {
                        set_binding(registration);
                        let _ = affinity::set_current_affinity(&mask);
                    }
                }
            }
        });
    }
}
