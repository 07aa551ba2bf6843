//! Issue 41's counts: how many slots state per concurrency id ([`qpw_core::PerCid`]) makes and
//! a drain visits, against per-CPU state ([`qpw_core::PerCpu`]), with 1, 2, 4 and 8 threads
//! running at once on this machine; and what each costs in memory (a per-CPU slot counted as
//! one 128-byte cache-padded line, which it is in a release build).
//!
//! ```sh
//! cargo run --release -p qpw-core --example cid_counts
//! guest/qpw-guest --smp 8 --no-isolate --bin target/release/examples/cid_counts -- \
//!     "$PWD/target/release/examples/cid_counts"      # 8 vCPUs: counts only
//! ```
//!
//! Each round pins its threads to the allowed CPUs in turn (a service's threads spread over its
//! cores), starts them together (a barrier) and keeps them all running for a while, each
//! counting into its id's slot, so that the kernel gives them ids at the same time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use qpw_core::{Policy, Qpw};

fn main() -> Result<(), qpw_core::Error> {
    let qpw = Qpw::with_policy(Policy::Remote)?;
    let cpus = qpw.cpus().len();
    println!("{}", qpw_core::cid::status());
    println!("{}", qpw.describe());
    println!("threads  percpu_slots  percpu_visited  percpu_bytes  cid_slots  cid_visited  cid_bytes  counted");
    for threads in [1usize, 2, 4, 8] {
        let by_cpu = qpw.per_cpu(|_| 0u64);
        let by_id = qpw.per_cid(|_| 0u64);
        let barrier = Barrier::new(threads);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..threads {
                let cpu = qpw
                    .cpus()
                    .iter()
                    .nth(t % cpus)
                    .expect("a CPU of the instance");
                let (barrier, stop, by_id, by_cpu) = (&barrier, &stop, &by_id, &by_cpu);
                s.spawn(move || {
                    qpw_core::pin_current_thread(cpu).expect("pin to an allowed CPU");
                    barrier.wait();
                    while !stop.load(Ordering::Relaxed) {
                        *by_id.lock_local().unwrap() += 1;
                        *by_cpu.lock_local().unwrap() += 1;
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, Ordering::Relaxed);
        });
        let mut cpu_visited = 0;
        let mut by_cpu_total = 0;
        by_cpu.for_each_locked(|_, n| {
            cpu_visited += 1;
            by_cpu_total += *n;
        });
        let mut id_visited = 0;
        let mut by_id_total = 0;
        by_id.for_each_locked(|_, n| {
            id_visited += 1;
            by_id_total += *n;
        })?;
        assert_eq!(by_cpu_total, by_id_total, "every count is in both");
        println!(
            "{threads:>7}  {cpus:>12}  {cpu_visited:>14}  {:>12}  {:>9}  {id_visited:>11}  {:>9}  {by_id_total}",
            cpus * 128,
            by_id.slots(),
            by_id.memory()
        );
    }
    Ok(())
}
