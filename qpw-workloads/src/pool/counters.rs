//! What a pool counts, one block of counters per CPU.
//!
//! A pool operation that is itself a few nanoseconds of CPU-local work (a per-CPU pool's get)
//! must not be measured through counters that every CPU increments on one shared cache line:
//! that line would bounce between the CPUs on every get and put, costing each design what
//! the global lock costs, and hiding the difference between them. So each CPU counts in its
//! own cache-line-aligned block, chosen by the CPU the thread runs on (read from the rseq
//! area or `sched_getcpu`), and a report sums the blocks.

use qpw_core::sync::{AtomicU64, Ordering};

/// What is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Counter {
    /// Buffers handed out.
    Gets,
    /// Buffers given back.
    Puts,
    /// Gets that found no buffer.
    Exhausted,
    /// Failed trylocks on the global lock.
    Contention,
    /// Waits for a per-CPU lock held by another thread of the CPU.
    PercpuWaits,
    /// Failed compare-and-swaps on a return stack.
    CasRetries,
    /// Gets served without the global lock.
    LocalHits,
    /// Puts that went to another CPU's return stack.
    RemoteReturns,
    /// Buffers handed out while out, or returned while in.
    Violations,
}

const COUNTERS: usize = 9;

/// One CPU's counters, alone on their cache lines.
#[repr(align(128))]
#[derive(Debug)]
struct Block([AtomicU64; COUNTERS]);

/// A pool's counters, one [`Block`] per CPU.
#[derive(Debug)]
pub(super) struct Counters {
    blocks: Box<[Block]>,
}

impl Counters {
    /// A block for every CPU the process may run on.
    pub(super) fn new() -> Self {
        let cpus = qpw_core::allowed_cpus()
            .ok()
            .and_then(|set| set.last())
            .map_or(1, |last| last + 1);
        Self {
            blocks: (0..cpus)
                .map(|_| Block(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    /// Counts one `counter` on the calling thread's CPU.
    #[inline]
    pub(super) fn add(&self, counter: Counter) {
        let cpu = qpw_core::current_cpu().unwrap_or(0) % self.blocks.len();
        self.blocks[cpu].0[counter as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The sum over every CPU.
    pub(super) fn total(&self, counter: Counter) -> u64 {
        self.blocks
            .iter()
            .map(|b| b.0[counter as usize].load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use qpw_core::sync::thread;

    use super::*;

    #[test]
    fn counts_from_every_cpu_add_up() {
        let counters = Counters::new();
        let allowed = qpw_core::allowed_cpus().unwrap();
        let cpus: Vec<usize> = allowed.iter().take(2).collect();
        thread::scope(|s| {
            for &cpu in &cpus {
                let counters = &counters;
                s.spawn(move || {
                    qpw_core::pin_current_thread(cpu).unwrap();
                    for _ in 0..1000 {
                        counters.add(Counter::Contention);
                    }
                    counters.add(Counter::Gets);
                });
            }
        });
        let n = cpus.len() as u64;
        assert_eq!(counters.total(Counter::Contention), 1000 * n);
        assert_eq!(counters.total(Counter::Gets), n);
        assert_eq!(counters.total(Counter::Puts), 0);
        // Each pinned thread counted in its own CPU's block.
        for &cpu in &cpus {
            let block = &counters.blocks[cpu % counters.blocks.len()];
            assert_eq!(
                block.0[Counter::Contention as usize].load(Ordering::Relaxed),
                1000
            );
        }
    }
}
