//! Case 7 of issue 13: work items created and dropped give back what they took. A counting
//! global allocator (this test binary's own, so no other test's allocations interfere) measures
//! the bytes live before and after 10^5 items are made and dropped on a two-worker instance.

#![cfg(not(loom))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use qpw_core::{CpuSpec, Policy, Qpw};

/// The system allocator, counting the bytes currently allocated.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout, which meets `alloc`'s contract.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout (the caller's contract).
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller meets `realloc`'s contract.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const ITEMS: usize = 100_000;

/// The most the heap may grow by: a few warm-up allocations of the queues, nothing that scales
/// with the number of items (the leak this catches was 16 bytes per item on two workers).
const BOUND: isize = 64 * 1024;

#[test]
fn heap_does_not_grow_with_work_items_created_and_dropped() {
    let qpw = Qpw::builder()
        .cpus(CpuSpec::Logical(2))
        .policy(Policy::Queue)
        .build()
        .unwrap();
    // Warm up: the first items size the queues, and a run of each worker allocates its
    // thread-local state.
    for _ in 0..100 {
        let work = qpw.work(|_| {}).unwrap();
        work.queue_on(0).unwrap();
        work.queue_on(1).unwrap();
        work.flush(0).unwrap();
        work.flush(1).unwrap();
    }
    let before = LIVE.load(Ordering::Relaxed);
    for n in 0..ITEMS {
        let work = qpw.work(|_| {}).unwrap();
        if n % 1000 == 0 {
            work.queue_on(n / 1000 % 2).unwrap();
            work.flush(n / 1000 % 2).unwrap();
        }
    }
    let grown = LIVE.load(Ordering::Relaxed) - before;
    assert!(
        grown <= BOUND,
        "{ITEMS} work items created and dropped grew the heap by {grown} bytes (bound {BOUND})"
    );
}
