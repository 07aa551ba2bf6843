//! Bench 1, the local fast path: what the owner of a CPU pays to touch its own per-CPU state,
//! against the two baselines of STYLE 18 measured in the same group: a bare thread-local
//! increment (what the kernel's non-RT `local_lock` costs: nothing but the access) and a bare
//! uncontended atomic lock (what PREEMPT_RT pays).
//!
//! Issue 7's fast paths are here too, each with the baseline its acceptance names, so that
//! the ratios come from one run (`qpw_benches::FAST_PATH_BOUNDS` lists them; the `ratios`
//! report checks them):
//!
//! | bench | compared with | bound |
//! |---|---|---|
//! | `percpu_rseq_unbound`: `PerCpu<_, RseqLock>::lock_local` + increment + unlock, unbound thread | `rseq_cpu_atomic_lock`: the bare rseq `cpu_id` read choosing one of per-CPU bare atomic locks | 1.3x |
//! | `rseq_lock`: a bare `RseqLock` of the (pinned) caller's CPU + increment | `atomic_lock` | 1.0x |
//! | `percpu_owner`: `Owner::lock_local` + increment (owner-only policy) | `tls_cell` | 1.5x |
//! | `percpu_fenced_bound`: `PerCpu::lock_local` + increment in fenced mode (`Policy::Fenced`: each slot's lock a `FencedLock`), bound thread (issue 15) | `atomic_lock` | 1.0x |
//! | `percpu_fenced_bound_slot`: the same through `PerCpu::bound_slot` (the look-up done once) | `atomic_lock` | 1.0x |
//! | `fenced_poll_quiet`: `Binding::poll` on a fenced CPU that nobody calls (issue 34) | `relaxed_load`: a bare relaxed load of an `AtomicU32` | 1.5x |
//!
//! Issue 42's benches are here too: the floor (`floor`, a hand-written restartable-sequence
//! per-CPU increment, `benches/floor.rs`), and each owner path a second time through a call
//! the compiler may not inline (`*_call`: `tls_cell`, `atomic_lock`, `floor`, `rseq_lock`,
//! fenced `BoundSlot::lock`, and `lock_local` of the three modes and of the `RseqLock`),
//! which is what `tests/owner_path` counts and what a service's one call per request pays;
//! inlined into the loop, the compiler hoists the look-ups out of it. The `ratios` report's
//! table 1c divides each call by the floor's call (`floor_call`) and by the bare atomic
//! lock's (`atomic_lock_call`), and holds it to `qpw_benches::OWNER_CALL_BOUND` of its
//! baseline (`qpw_benches::OWNER_CALLS`).
//!
//! Every bench times a plain loop of `iters` calls, each result through one `black_box`
//! (`iter_custom` + [`looped`]). A first version used `b.iter(|| black_box(op()))`, which
//! passes every result through `black_box` twice (criterion's `iter` adds its own): for
//! `qpw_core::rseq::current_cpu`, whose result is a 16-byte `Option<usize>`, that measured
//! 15-25 ns instead of 3-5 ns, probably a store-forwarding stall (the value stored in two
//! 8-byte halves, then loaded whole), not a cost of the rseq read; a standalone program agreed
//! with the plain loop. That form is kept as `rseq_cpu_criterion_iter` so the artefact stays
//! visible.

use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use criterion::Criterion;
use qpw_benches::{Timing, LOCAL};
use qpw_core::{
    BoundSlot, CpuSpec, FairLock, FencedLock, PerCpu, Policy, Qpw, RawLocalLock, RseqLock,
};

use crate::floor::Floor;

thread_local! {
    static COUNTER: Cell<u64> = const { Cell::new(0) };
}

/// Times `iters` calls of `op` in a plain loop, each result through `black_box`.
#[inline(always)]
pub(crate) fn looped<R>(iters: u64, mut op: impl FnMut() -> R) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        black_box(op());
    }
    start.elapsed()
}

/// The bare atomic lock: one word, compare-and-swap to take, a release store to drop.
#[derive(Default)]
struct SpinWord(AtomicBool);

impl SpinWord {
    #[inline]
    fn lock(&self) {
        while self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
    }

    #[inline]
    fn unlock(&self) {
        self.0.store(false, Ordering::Release);
    }
}

// Issue 42: each owner path once more through a call the compiler may not inline (what
// `tests/owner_path` counts), beside the same path inlined into the loop, where the compiler
// may hoist the look-ups out of it. Each is one call per iteration of `looped`.

/// The bare thread-local increment, through a call.
#[inline(never)]
fn tls_cell_call() {
    COUNTER.with(|c| c.set(c.get() + 1));
}

/// The bare atomic lock around the increment, through a call.
#[inline(never)]
fn atomic_lock_call(word: &SpinWord, n: &mut u64) {
    word.lock();
    *n += 1;
    word.unlock();
}

/// The hand-written floor (`benches/floor.rs`), through a call.
#[inline(never)]
fn floor_call(floor: &Floor) {
    floor.increment();
}

/// A bare `RseqLock` around the increment, through a call.
#[inline(never)]
fn rseq_lock_call(lock: &RseqLock, n: &mut u64) {
    lock.lock();
    *n += 1;
    // SAFETY: taken on the line above by this thread, released once.
    unsafe { lock.unlock() };
}

/// `lock_local` + increment + release through a call, as a service's call site writes it
/// (the error returned with `?`): `tests/owner_path`'s `lock_local?` probe.
#[inline(never)]
fn lock_local_call<L: RawLocalLock>(state: &PerCpu<u64, L>) -> qpw_core::Result<()> {
    *state.lock_local()? += 1;
    Ok(())
}

/// `BoundSlot::lock` + increment + release through a call: `tests/owner_path`'s probe.
#[inline(never)]
fn bound_slot_call(slot: &BoundSlot<'_, u64>) {
    *slot.lock() += 1;
}

/// One of the per-CPU bare locks of `rseq_cpu_atomic_lock`, with its counter, on cache lines
/// of its own (as `PerCpu` pads its slots).
#[repr(align(128))]
#[derive(Default)]
struct PaddedWord {
    word: SpinWord,
    n: Cell<u64>,
}

/// A physical instance (the CPUs this process may use) in `policy`, for the fast paths.
fn physical(policy: Policy) -> Qpw {
    Qpw::builder()
        .cpus(CpuSpec::Allowed)
        .policy(policy)
        .build()
        .expect("a qpw instance over the allowed CPUs")
}

pub(crate) fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group(LOCAL);
    crate::configure(&mut group, Timing::fast_path());

    // Baseline 1: a bare thread-local increment.
    group.bench_function("tls_cell", |b| {
        b.iter_custom(|iters| looped(iters, || COUNTER.with(|c| c.set(black_box(c.get()) + 1))))
    });

    // Baseline 2: a bare uncontended atomic lock around the same increment.
    let word = SpinWord(AtomicBool::new(false));
    let mut n = 0u64;
    group.bench_function("atomic_lock", |b| {
        b.iter_custom(|iters| {
            looped(iters, || {
                word.lock();
                n = black_box(n) + 1;
                word.unlock();
            })
        })
    });

    let mut n = 0u64;
    group.bench_function("atomic_lock_call", |b| {
        b.iter_custom(|iters| looped(iters, || atomic_lock_call(&word, &mut n)))
    });
    group.bench_function("tls_cell_call", |b| {
        b.iter_custom(|iters| looped(iters, tls_cell_call))
    });

    // The floor (issue 42): the hand-written restartable-sequence increment, on a thread pinned
    // as the framework's benches below are.
    floor(&mut group);

    // The framework's default lock, alone: parking_lot's word with a fair release.
    let fair = FairLock::new();
    let mut n = 0u64;
    group.bench_function("fair_lock", |b| {
        b.iter_custom(|iters| {
            looped(iters, || {
                fair.lock();
                n = black_box(n) + 1;
                // SAFETY: taken on the line above by this thread, released once.
                unsafe { fair.unlock() };
            })
        })
    });

    // How an unbound thread learns its CPU.
    group.bench_function("sched_getcpu", |b| {
        // SAFETY: `sched_getcpu` has no preconditions; it only reads the caller's CPU.
        b.iter_custom(|iters| looped(iters, || black_box(unsafe { libc::sched_getcpu() })))
    });

    // The same question answered by one load from glibc's rseq area.
    if qpw_core::rseq::available() {
        group.bench_function("rseq_cpu", |b| {
            b.iter_custom(|iters| looped(iters, qpw_core::rseq::current_cpu))
        });
        // The same call through criterion's own `b.iter`: see the module docs.
        group.bench_function("rseq_cpu_criterion_iter", |b| {
            b.iter(|| black_box(qpw_core::rseq::current_cpu()))
        });
        // Issue 7's baseline for an unbound thread: the bare rseq read picks one of per-CPU
        // bare atomic locks, which it takes around the increment. What `PerCpu::lock_local`
        // does, with nothing of the framework around it.
        let words: Vec<PaddedWord> = (0..=qpw_core::CpuSet::MAX_CPU)
            .map(|_| PaddedWord::default())
            .collect();
        group.bench_function("rseq_cpu_atomic_lock", |b| {
            b.iter_custom(|iters| {
                looped(iters, || {
                    let cpu = qpw_core::rseq::current_cpu().expect("checked: rseq is available");
                    let PaddedWord { word, n } = &words[cpu];
                    word.lock();
                    n.set(n.get() + 1);
                    word.unlock();
                })
            })
        });
    } else {
        eprintln!("local/rseq_cpu*: skipped: {}", qpw_core::rseq::status());
    }

    // `PerCpu::lock_local` + increment + unlock, in each mode, bound and unbound.
    for (mode, policy) in [("queue", Policy::Queue), ("remote", Policy::Remote)] {
        let qpw = physical(policy);
        let stock = qpw.per_cpu(|_| 0u64);
        let cpu = qpw.cpus().iter().next().expect("at least one allowed CPU");
        {
            let _bound = qpw.bind_current(cpu).expect("bind to an allowed CPU");
            group.bench_function(format!("percpu_{mode}_bound"), |b| {
                b.iter_custom(|iters| {
                    looped(iters, || {
                        *stock.lock_local().expect("a bound thread has a CPU") += 1;
                    })
                })
            });
            group.bench_function(format!("percpu_{mode}_bound_call"), |b| {
                b.iter_custom(|iters| {
                    looped(iters, || {
                        lock_local_call(&stock).expect("a bound thread has a CPU");
                    })
                })
            });
        }
        group.bench_function(format!("percpu_{mode}_unbound"), |b| {
            b.iter_custom(|iters| {
                looped(iters, || {
                    *stock
                        .lock_local()
                        .expect("a thread of a physical instance has a CPU") += 1;
                })
            })
        });
        let mut total = 0;
        stock.for_each_locked(|_, n| total += *n);
        black_box(total);
    }

    // Remote mode with the `FairLock` named (`per_cpu_with`), against `percpu_remote_bound`
    // (the default `PwLock`, which picks the same `FairLock` for a remote CPU): what the
    // default lock's choice of protocol per CPU costs the owner.
    {
        let qpw = physical(Policy::Remote);
        let stock = qpw
            .per_cpu_with::<FairLock, _>(|_| 0u64)
            .expect("a FairLock PerCpu in remote mode");
        let cpu = qpw.cpus().iter().next().expect("at least one allowed CPU");
        let _bound = qpw.bind_current(cpu).expect("bind to an allowed CPU");
        group.bench_function("percpu_remote_fair_bound", |b| {
            b.iter_custom(|iters| {
                looped(iters, || {
                    *stock.lock_local().expect("a bound thread has a CPU") += 1;
                })
            })
        });
    }

    // The restartable-sequence lock (queue mode only: it has no remote path), as its doc
    // example makes it: `per_cpu_with::<RseqLock, _>`.
    let qpw = physical(Policy::Queue);
    let stock = qpw
        .per_cpu_with::<RseqLock, _>(|_| 0u64)
        .expect("an rseq-locked PerCpu in queue mode");
    eprintln!(
        "local/percpu_rseq_*: RseqLock uses the {} protocol ({})",
        RseqLock::kind().name(),
        qpw_core::rseq::status()
    );
    let cpu = qpw.cpus().iter().next().expect("at least one allowed CPU");
    {
        let _bound = qpw.bind_current(cpu).expect("bind to an allowed CPU");
        // The bare lock, taken on its own CPU (the thread is pinned there): the restartable
        // sequence and the plain-store release, against `atomic_lock`.
        let lock = RseqLock::for_cpu(cpu);
        let mut n = 0u64;
        group.bench_function("rseq_lock", |b| {
            b.iter_custom(|iters| {
                looped(iters, || {
                    lock.lock();
                    n = black_box(n) + 1;
                    // SAFETY: taken on the line above by this thread, released once.
                    unsafe { lock.unlock() };
                })
            })
        });
        let mut n = 0u64;
        group.bench_function("rseq_lock_call", |b| {
            b.iter_custom(|iters| looped(iters, || rseq_lock_call(&lock, &mut n)))
        });
        group.bench_function("percpu_rseq_bound", |b| {
            b.iter_custom(|iters| {
                looped(iters, || {
                    *stock.lock_local().expect("a bound thread has a CPU") += 1;
                })
            })
        });
        group.bench_function("percpu_rseq_bound_call", |b| {
            b.iter_custom(|iters| {
                looped(iters, || {
                    lock_local_call(&stock).expect("a bound thread has a CPU");
                })
            })
        });
    }
    group.bench_function("percpu_rseq_unbound", |b| {
        b.iter_custom(|iters| {
            looped(iters, || {
                *stock
                    .lock_local()
                    .expect("a thread of a physical instance has a CPU") += 1;
            })
        })
    });

    // Fenced mode (issue 15): CPUs whose slots are behind a `FencedLock`, drained as in remote
    // mode. The owner's path (through `lock_local`, through a `BoundSlot`, and with the lock
    // named), against `percpu_remote_bound`; then the requester's cost: this thread takes another CPU's lock (a `CAS`, the membarrier
    // fence of that CPU, the release), first with none of our threads on that CPU (the kernel
    // skips the interrupt), then with one of ours spinning there (the interrupt is sent).
    fenced(&mut group);

    // The owner-only policy (thread-per-core), as its doc example makes it: the bench thread
    // claims the CPU's slot and reaches it with a borrow flag, no lock word.
    let stock = qpw
        .owned_per_cpu(|_| 0u64)
        .expect("owner-only state in queue mode");
    {
        let mut owner = stock.claim(cpu).expect("claim an allowed CPU");
        group.bench_function("percpu_owner", |b| {
            b.iter_custom(|iters| {
                looped(iters, || {
                    *owner.lock_local().expect("the owner reaches its slot") += 1;
                })
            })
        });
    }

    group.finish();
}

/// The floor's two benches (issue 42), inlined into the loop and through a call, on a
/// thread pinned to the first allowed CPU as the framework's bound benches are; skipped,
/// saying why, where the hand-written sequence cannot run.
fn floor(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let before = qpw_core::current_affinity().expect("the thread's affinity");
    let cpu = qpw_core::allowed_cpus()
        .expect("the allowed CPUs")
        .first()
        .expect("at least one allowed CPU");
    qpw_core::pin_current_thread(cpu).expect("pin to an allowed CPU");
    match Floor::new() {
        Some(floor) => {
            group.bench_function("floor", |b| {
                b.iter_custom(|iters| looped(iters, || floor.increment()))
            });
            group.bench_function("floor_call", |b| {
                b.iter_custom(|iters| looped(iters, || floor_call(&floor)))
            });
            black_box(floor.total());
        }
        None => eprintln!(
            "local/floor*: skipped: no rseq registration for this thread, or not x86-64 ({})",
            qpw_core::rseq::status()
        ),
    }
    qpw_core::set_current_affinity(&before).expect("the affinity back");
}

/// The fenced-mode benches (issue 15), as described where `bench` calls this.
fn fenced(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    // Fenced mode as the policy makes it: `per_cpu` gives every slot of a fenced CPU a
    // `FencedLock` (through the default `PwLock`).
    let qpw = physical(Policy::Fenced);
    let stock = qpw.per_cpu(|_| 0u64);
    eprintln!(
        "local/percpu_fenced_*, fenced_remote_*: FencedLock uses the {} protocol ({})",
        FencedLock::kind().name(),
        qpw_core::rseq::status()
    );
    let mut cpus = qpw.cpus().iter();
    let cpu = cpus.next().expect("at least one allowed CPU");
    let bound = qpw.bind_current(cpu).expect("bind to an allowed CPU");
    group.bench_function("percpu_fenced_bound", |b| {
        b.iter_custom(|iters| {
            looped(iters, || {
                *stock.lock_local().expect("a bound thread has a CPU") += 1;
            })
        })
    });
    group.bench_function("percpu_fenced_bound_call", |b| {
        b.iter_custom(|iters| {
            looped(iters, || {
                lock_local_call(&stock).expect("a bound thread has a CPU");
            })
        })
    });
    // The owner's path with the look-up done once (`PerCpu::bound_slot`): what a pinned
    // thread's hot loop pays.
    let mine = stock.bound_slot(&bound).expect("the slot of the bound CPU");
    group.bench_function("percpu_fenced_bound_slot", |b| {
        b.iter_custom(|iters| {
            looped(iters, || {
                *mine.lock() += 1;
            })
        })
    });
    group.bench_function("percpu_fenced_bound_slot_call", |b| {
        b.iter_custom(|iters| looped(iters, || bound_slot_call(&mine)))
    });
    // The same mode with the `FencedLock` named (`per_cpu_with`): no choice of protocol per
    // slot on the owner's path.
    let named = qpw
        .per_cpu_with::<FencedLock, _>(|_| 0u64)
        .expect("a FencedLock PerCpu in fenced mode");
    group.bench_function("percpu_fenced_lock_bound", |b| {
        b.iter_custom(|iters| {
            looped(iters, || {
                *named.lock_local().expect("a bound thread has a CPU") += 1;
            })
        })
    });
    // The owner's poll when nobody has called (issue 34), beside the one load it should cost.
    let word = AtomicU32::new(0);
    group.bench_function("relaxed_load", |b| {
        b.iter_custom(|iters| looped(iters, || word.load(Ordering::Relaxed)))
    });
    let _ = bound.poll(); // a call of an earlier bench, answered
    group.bench_function("fenced_poll_quiet", |b| {
        b.iter_custom(|iters| looped(iters, || bound.poll()))
    });
    let Some(other) = cpus.next() else {
        eprintln!("local/fenced_remote_*: skipped: one allowed CPU, no other CPU to fence");
        return;
    };
    let remote = |b: &mut criterion::Bencher<'_>| {
        b.iter_custom(|iters| {
            looped(iters, || {
                *stock.lock(other).expect("a remote-mode CPU") += 1;
            })
        })
    };
    group.bench_function("fenced_remote_idle_target", remote);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let spinner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            qpw_core::pin_current_thread(other).expect("pin the spinner");
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    group.bench_function("fenced_remote_busy_target", remote);
    stop.store(true, Ordering::Relaxed);
    spinner.join().expect("the spinner stops");
}
