//! Queue, remote and fenced mode on this machine's CPUs.
//!
//! Each CPU's own thread fills a per-CPU cache; then a requester drains every CPU, once with
//! the work queued to each CPU's worker (the kernel's `queue_work_on` + `flush_work`), once
//! run in the requester under each CPU's lock (QPW's remote mode), and once the same way
//! under locks that the owners take with restartable sequences and the requester with a
//! `membarrier` fence of each CPU (fenced mode). The example prints where each drain ran and
//! checks that nothing was lost.
//!
//! ```text
//! cargo run --release -p qpw-core --example modes
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use qpw_core::{Policy, Qpw};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for policy in [Policy::Queue, Policy::Remote, Policy::Fenced] {
        let qpw = Arc::new(Qpw::with_policy(policy)?);
        println!("{}", qpw.describe());

        // Per-CPU caches of "pages", filled by a thread bound to each CPU.
        let cache = Arc::new(qpw.per_cpu(|_cpu| 0u64));
        let mut filled = 0;
        for cpu in qpw.cpus().iter() {
            let (qpw, cache) = (qpw.clone(), cache.clone());
            filled += std::thread::spawn(move || -> qpw_core::Result<u64> {
                let _bound = qpw.bind_current(cpu)?;
                *cache.lock_local()? += 100 + cpu as u64;
                Ok(100 + cpu as u64)
            })
            .join()
            .map_err(|_| "a filler thread panicked")??;
        }

        // The drain: whichever CPU it runs for, it empties that CPU's cache.
        let global = Arc::new(AtomicU64::new(0));
        let (c, g) = (cache.clone(), global.clone());
        let drain = qpw.work(move |ctx| {
            let Ok(mut local) = c.lock_work(ctx) else {
                return; // a remote run past its drain's deadline: the drain reports it
            };
            g.fetch_add(*local, Ordering::Relaxed);
            *local = 0;
            let ran_on = qpw_core::current_cpu().map_or("?".to_string(), |c| c.to_string());
            let how = match (ctx.is_queued(), ctx.is_remote()) {
                (true, _) => "by its worker",
                (false, true) => "remotely, in the requester",
                (false, false) => "in the requester, which runs on that CPU",
            };
            println!("  drained cpu {} {how}, on cpu {ran_on}", ctx.cpu());
        })?;

        let start = Instant::now();
        let report = drain.drain_all(|_cpu| true).into_result()?;
        let elapsed = start.elapsed();
        println!(
            "  drain_all: queued to {}, run remotely on {}, in {elapsed:?}",
            report.queued, report.ran_remote
        );
        assert_eq!(
            global.load(Ordering::Relaxed),
            filled,
            "every page drained once"
        );
        println!("  {filled} pages drained, none lost\n");
    }
    Ok(())
}
