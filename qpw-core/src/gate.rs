//! The gate remote-mode runs pass through, so that a shutdown can refuse new ones and wait for
//! those in flight.
//!
//! # The problem
//!
//! A queue-mode run happens on a worker, which a shutdown stops and joins. A remote-mode run
//! happens in whatever thread called `queue_on` or `drain_all`, which the instance does not own:
//! without a gate, a shutdown cannot refuse it (it ran after `shutdown` returned, issue 13 case
//! 1) nor know when the last one has finished.
//!
//! # The mechanism
//!
//! One word: bit 0 is "closed", the rest counts the runs in flight (in units of [`RUN`]). A
//! run enters with one `fetch_add` and looks at the bit it got back: open means it may run
//! (and is counted); closed means it takes its unit back and is refused. A shutdown sets the
//! bit with one `fetch_or`, then sleeps until the count falls to the number of runs it is
//! itself inside (a shutdown called from inside a remote run must not wait for its own run).
//! The read-modify-writes on one word are totally ordered, so each run either entered before
//! the close (and the shutdown waits for it) or sees the bit (and is refused): there is no
//! third case. A run that leaves after the close wakes the shutdown under the gate's mutex,
//! which the shutdown holds from its look at the count until it sleeps, so the wake-up cannot
//! fall between the two. The open path costs two uncontended atomic read-modify-writes per
//! remote run, and nothing on the local fast paths.
//!
//! The runs a thread is inside are counted per thread, over all instances (a run of one
//! instance can queue remote work of another). A shutdown from inside runs of other instances
//! therefore waits for at most that many fewer runs than it should: it may return while a
//! run of another thread is still finishing, but it never waits for itself.

use std::cell::Cell;

use crate::sync::{thread_local, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};

/// The "closed" bit of the gate's word.
const CLOSED: usize = 1;
/// One run in flight.
const RUN: usize = 2;

#[cfg(not(loom))]
thread_local! {
    /// How many remote runs (of any instance) the calling thread is inside.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

#[cfg(loom)]
thread_local! {
    /// As above; loom's `thread_local!` takes no `const` initialiser.
    #[allow(clippy::missing_const_for_thread_local)]
    static DEPTH: Cell<usize> = Cell::new(0);
}

/// How many remote runs the calling thread is inside.
fn depth() -> usize {
    DEPTH.with(Cell::get)
}

/// See the [module docs](self).
#[derive(Debug)]
pub(crate) struct RunGate {
    word: AtomicUsize,
    idle: Mutex<()>,
    left: Condvar,
}

/// A run's passage through the gate: it is counted until this is dropped.
#[must_use]
pub(crate) struct Pass<'a> {
    gate: &'a RunGate,
}

impl RunGate {
    /// An open gate with no run in flight.
    pub(crate) fn new() -> Self {
        Self {
            word: AtomicUsize::new(0),
            idle: Mutex::new(()),
            left: Condvar::new(),
        }
    }

    /// Lets a run in, or `None` once the gate is closed.
    #[inline]
    pub(crate) fn enter(&self) -> Option<Pass<'_>> {
        // Acquire: a run admitted after a (hypothetical) reopening would see what came before;
        // what matters here is only the total order of the read-modify-writes on the word.
        let before = self.word.fetch_add(RUN, Ordering::Acquire);
        if before & CLOSED != 0 {
            self.leave();
            return None;
        }
        DEPTH.with(|d| d.set(d.get() + 1));
        Some(Pass { gate: self })
    }

    /// Takes a run's unit back, waking a shutdown that waits for it.
    fn leave(&self) {
        // Release: the run's effects happen before the shutdown's Acquire look at the count.
        let before = self.word.fetch_sub(RUN, Ordering::Release);
        if before & CLOSED != 0 {
            // Under the mutex, so that a shutdown between its look at the count and its sleep
            // cannot miss this.
            drop(lock(&self.idle));
            self.left.notify_all();
        }
    }

    /// Refuses every run from now on.
    pub(crate) fn close(&self) {
        self.word.fetch_or(CLOSED, Ordering::AcqRel);
    }

    /// Whether [`close`](Self::close) has been called.
    pub(crate) fn is_closed(&self) -> bool {
        self.word.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Sleeps until no run is in flight but those the calling thread is itself inside. Call
    /// after [`close`](Self::close): until then runs may keep coming.
    pub(crate) fn wait_idle(&self) {
        let own = depth();
        let mut idle = lock(&self.idle);
        while self.word.load(Ordering::Acquire) / RUN > own {
            idle = self.left.wait(idle).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
        self.gate.leave();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing runs user code under this mutex: a poisoned one guards nothing inconsistent.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn refuses_after_close_and_counts_the_runs_in_flight() {
        let gate = RunGate::new();
        let pass = gate.enter().expect("open");
        assert_eq!(depth(), 1);
        gate.close();
        assert!(gate.is_closed());
        assert!(gate.enter().is_none(), "closed");
        assert_eq!(depth(), 1, "a refused run is not counted");
        // The run in flight is this thread's own: waiting for it would never end.
        gate.wait_idle();
        drop(pass);
        assert_eq!(depth(), 0);
        gate.wait_idle();
    }
}
