//! The owner's path, counted in instructions (issue 21's "within 5 %", settled without a PMU;
//! issues 31 and 42). These VMs expose no hardware counters, and at 1-2 ns a path's timing
//! moves with code layout by more than the 5 % asked for (`docs/results.md`, 6d), so this test
//! counts instead: it wraps each owner path in an `#[inline(never)]` probe, finds the
//! instructions one uncontended call of the probe executes, and asserts that
//!
//! - fenced mode's paths (`BoundSlot::lock` + release, `lock_local` + release, the default
//!   lock on a `Policy::Fenced` instance), the `RseqLock`'s (`lock_local` + release, queue
//!   mode) and the floor's have **no atomic read-modify-write** (no `lock`-prefixed
//!   instruction, no `xchg` with memory), and remote and queue mode's (`FairLock`, through the
//!   same default lock) exactly two, its compare-and-swap pair;
//! - no path is longer than its budget: issue 42's goal where it is met (fenced
//!   `BoundSlot::lock` at most 20), else the shortest count reached (rustc 1.95.0;
//!   `docs/results.md`, 6e, says what each instruction is for).
//!
//! Beside the framework's paths it counts **the floor** (`benches/floor.rs`, included here): a
//! hand-written restartable-sequence per-CPU increment with a lock word, the shortest path a
//! per-CPU lock can have, which `benches/local.rs` times beside the same paths.
//!
//! `lock_local` is counted at two call sites: `if let Ok(mut slot) = state.lock_local() { .. }`
//! (what issues 21 to 44 counted), where the `Result` is dropped in the probe, after the
//! guard, and so goes through memory (its error has a destructor the compiler will not look
//! through); and `*state.lock_local()? += 1` in a function that returns the error, a service's
//! call site, where it does not.
//!
//! # The counting rule
//!
//! A path is the instructions, in order, that one call of the probe executes from its first
//! instruction to its `ret`, on the uncontended owner path: the calling thread is bound to
//! the slot's CPU (pinned there) and runs there, the lock is free with no waiter, the thread's
//! rseq area is registered and cached (a warm-up call ran), and no restartable sequence is
//! aborted. Everything inlined into the probe counts: the binding's look-up, the slot, the
//! restartable sequences (inline assembly), the `+= 1` on the data, the guard's drop with
//! the release, and the probe's own prologue and epilogue. Instructions jumped over do not
//! count, and neither does anything behind a `call` (the slow paths, `#[cold]` and out of
//! line): the uncontended path calls nothing, and a walk that meets a `call` fails. This is
//! what `docs/results.md` 6d counted by hand; here the branches are decided by running the
//! probe's machine code in a small interpreter over this process's live state (`x86.rs`),
//! so the count cannot take a branch the CPU would not.
//!
//! # How it runs
//!
//! Only the release build means anything, so a debug build skips with a message; CI runs
//! `cargo test --release -p qpw-tests --test reentrant --test owner_path` (`.ci/run`), one
//! release build for both. It needs `objdump`
//! (Debian's binutils) and x86-64, and skips, saying so, without them; the fenced and rseq
//! paths need restartable sequences, and are skipped, saying so, in the fallback (where those
//! locks are `FairLock`s), as is the floor. `QPW_SHOW_PATHS=1` prints each path as it was
//! counted.

#![cfg(not(loom))]

#[cfg(target_arch = "x86_64")]
mod x86;

// The hand-written floor, the same file the benches time.
#[path = "../../benches/floor.rs"]
mod floor;

use floor::Floor;
use qpw_core::{BoundSlot, PerCpu, RseqLock};

/// The floor: the hand-written restartable-sequence increment (`benches/floor.rs`).
#[no_mangle]
#[inline(never)]
pub(crate) fn qpw_probe_floor(floor: &Floor) {
    floor.increment();
}

/// `lock_local` + increment + release, with the default lock (`PwLock`): fenced or remote
/// mode by the instance's policy. The `Result` is matched and then dropped where it was made
/// (`if let`): what a call site that ignores the error writes.
#[no_mangle]
#[inline(never)]
pub fn qpw_probe_lock_local(state: &PerCpu<u64>) {
    if let Ok(mut slot) = state.lock_local() {
        *slot += 1;
    }
}

/// The same as a service's call site writes it: the error returned with `?`, nothing of the
/// `Result` left to drop.
#[no_mangle]
#[inline(never)]
pub fn qpw_probe_lock_local_try(state: &PerCpu<u64>) -> qpw_core::Result<()> {
    *state.lock_local()? += 1;
    Ok(())
}

/// `BoundSlot::lock` + increment + release, with the default lock.
#[no_mangle]
#[inline(never)]
pub fn qpw_probe_bound_slot(slot: &BoundSlot<'_, u64>) {
    *slot.lock() += 1;
}

/// `lock_local` + increment + release of an `RseqLock` (queue mode only), `if let`.
#[no_mangle]
#[inline(never)]
pub fn qpw_probe_rseq_lock_local(state: &PerCpu<u64, RseqLock>) {
    if let Ok(mut slot) = state.lock_local() {
        *slot += 1;
    }
}

/// The same with `?`.
#[no_mangle]
#[inline(never)]
pub fn qpw_probe_rseq_lock_local_try(state: &PerCpu<u64, RseqLock>) -> qpw_core::Result<()> {
    *state.lock_local()? += 1;
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod count {
    use std::path::Path;

    use qpw_core::{BoundSlot, LocalLockKind, PerCpu, Policy, Qpw, RseqLock};

    use super::x86::{follow, Listing};
    use super::{
        qpw_probe_bound_slot, qpw_probe_floor, qpw_probe_lock_local, qpw_probe_lock_local_try,
        qpw_probe_rseq_lock_local, qpw_probe_rseq_lock_local_try, Floor,
    };

    /// One owner path: which probe, on what state, and what it may cost.
    struct Case {
        name: &'static str,
        symbol: &'static str,
        /// The most instructions the path may take (see the constants below for where each
        /// comes from).
        budget: usize,
        /// How many atomic read-modify-writes it must have.
        locked: usize,
    }

    // Issue 42's goals, where they hold: fenced `BoundSlot::lock` at most 20 instructions
    // (19 reached). `lock_local`'s goal of 30 is not met: each budget is the count reached
    // with rustc 1.95.0 (before issue 42, at b276860: fenced `BoundSlot::lock` 54,
    // `lock_local` 88, remote 60 and 26, `RseqLock` 83, all `if let`); docs/results.md, 6e,
    // says what each of their instructions is for. (`RseqLock` with `?` was 30 until an
    // unbound thread's release was made inline again, which moved two jumps and a register
    // onto it.) Remote mode's `BoundSlot::lock` had no goal; it went from 26 to 23.

    const FLOOR: Case = Case {
        name: "floor: hand-written restartable-sequence increment",
        symbol: "qpw_probe_floor",
        budget: 14,
        locked: 0,
    };
    const FENCED_BOUND_SLOT: Case = Case {
        name: "fenced, BoundSlot::lock + release",
        symbol: "qpw_probe_bound_slot",
        budget: 20,
        locked: 0,
    };
    const FENCED_LOCK_LOCAL_TRY: Case = Case {
        name: "fenced, lock_local? + release",
        symbol: "qpw_probe_lock_local_try",
        budget: 38,
        locked: 0,
    };
    const FENCED_LOCK_LOCAL: Case = Case {
        name: "fenced, lock_local + release (if let)",
        symbol: "qpw_probe_lock_local",
        budget: 39,
        locked: 0,
    };
    const REMOTE_BOUND_SLOT: Case = Case {
        name: "remote (FairLock), BoundSlot::lock + release",
        symbol: "qpw_probe_bound_slot",
        budget: 23,
        locked: 2,
    };
    const REMOTE_LOCK_LOCAL_TRY: Case = Case {
        name: "remote (FairLock), lock_local? + release",
        symbol: "qpw_probe_lock_local_try",
        budget: 33,
        locked: 2,
    };
    const REMOTE_LOCK_LOCAL: Case = Case {
        name: "remote (FairLock), lock_local + release (if let)",
        symbol: "qpw_probe_lock_local",
        budget: 33,
        locked: 2,
    };
    const QUEUE_LOCK_LOCAL_TRY: Case = Case {
        name: "queue (FairLock), lock_local? + release",
        symbol: "qpw_probe_lock_local_try",
        budget: 33,
        locked: 2,
    };
    const QUEUE_LOCK_LOCAL: Case = Case {
        name: "queue (FairLock), lock_local + release (if let)",
        symbol: "qpw_probe_lock_local",
        budget: 33,
        locked: 2,
    };
    const RSEQ_LOCK_LOCAL_TRY: Case = Case {
        name: "queue, RseqLock named, lock_local? + release",
        symbol: "qpw_probe_rseq_lock_local_try",
        budget: 32,
        locked: 0,
    };
    const RSEQ_LOCK_LOCAL: Case = Case {
        name: "queue, RseqLock named, lock_local + release (if let)",
        symbol: "qpw_probe_rseq_lock_local",
        budget: 41,
        locked: 0,
    };

    /// Walks `case`'s probe at `entry` with `args` and prints its count: `Err` with the path
    /// and the probe's disassembly if it breaks the case's rule.
    fn check(exe: &Path, case: &Case, entry: usize, args: &[usize]) -> Result<(), String> {
        let listing = Listing::of(exe, case.symbol)?;
        let args: Vec<u64> = args.iter().map(|&a| a as u64).collect();
        let walk = follow(&listing, entry as u64, &args).map_err(|e| {
            format!(
                "{}: the walk failed: {e}\nthe probe:\n{}",
                case.name,
                listing.render()
            )
        })?;
        let count = walk.steps.len();
        let locked = walk
            .steps
            .iter()
            .filter(|&&i| listing.insns[i].is_locked())
            .count();
        println!(
            "{}: {count} instructions (budget {}), {locked} atomic read-modify-writes",
            case.name, case.budget
        );
        if std::env::var_os("QPW_SHOW_PATHS").is_some() {
            println!("{}", walk.render(&listing));
        }
        if locked == case.locked && count <= case.budget {
            return Ok(());
        }
        Err(format!(
            "{}: {count} instructions (budget {}), {locked} atomic read-modify-writes \
             (expected {}); if the compiler changed, count again and record the new counts \
             (docs/results.md, 6e); the path:\n{}\nthe probe:\n{}",
            case.name,
            case.budget,
            case.locked,
            walk.render(&listing),
            listing.render()
        ))
    }

    /// What a `Result<(), Error>` probe returns through: the place its caller gives it.
    type ResultPlace = std::mem::MaybeUninit<qpw_core::Result<()>>;

    /// The owner paths of the default lock (`lock_local` both ways, `BoundSlot::lock`) on an
    /// instance of `policy`, with the calling thread bound to its last CPU. `[if let, ?,
    /// bound slot]`; no bound slot in queue mode, whose `BoundSlot` is remote mode's path.
    fn default_lock(exe: &Path, policy: Policy, cases: &[&Case]) -> Vec<Result<(), String>> {
        let qpw = Qpw::with_policy(policy).expect("an instance on the allowed CPUs");
        let cpu = qpw.cpus().iter().last().expect("a CPU");
        let state: PerCpu<u64> = qpw.per_cpu(|_| 0);
        let binding = qpw.bind_current(cpu).expect("bind to an allowed CPU");
        let slot = state.bound_slot(&binding).expect("the bound CPU's slot");
        // Warm up (the thread's rseq area cached, the binding read once), and check that the
        // probes do what they say.
        for _ in 0..2 {
            qpw_probe_lock_local(&state);
            qpw_probe_lock_local_try(&state).expect("a bound thread's lock_local");
            qpw_probe_bound_slot(&slot);
        }
        assert_eq!(*state.lock_local().expect("the slot"), 6);
        let lock_local: fn(&PerCpu<u64>) = qpw_probe_lock_local;
        let lock_local_try: fn(&PerCpu<u64>) -> qpw_core::Result<()> = qpw_probe_lock_local_try;
        let bound_slot: fn(&BoundSlot<'_, u64>) = qpw_probe_bound_slot;
        let mut place = ResultPlace::uninit();
        let state_at = &state as *const _ as usize;
        let mut outcomes = vec![
            check(exe, cases[0], lock_local as usize, &[state_at]),
            check(
                exe,
                cases[1],
                lock_local_try as usize,
                &[place.as_mut_ptr() as usize, state_at],
            ),
        ];
        if let Some(case) = cases.get(2) {
            outcomes.push(check(
                exe,
                case,
                bound_slot as usize,
                &[&slot as *const _ as usize],
            ));
        }
        outcomes
    }

    /// `RseqLock`'s `lock_local` on a queue-mode instance, bound to its last CPU, both ways.
    fn rseq_lock(exe: &Path) -> Vec<Result<(), String>> {
        let qpw = Qpw::with_policy(Policy::Queue).expect("an instance on the allowed CPUs");
        let cpu = qpw.cpus().iter().last().expect("a CPU");
        let state = qpw
            .per_cpu_with::<RseqLock, _>(|_| 0u64)
            .expect("RseqLock in queue mode");
        let _binding = qpw.bind_current(cpu).expect("bind to an allowed CPU");
        for _ in 0..2 {
            qpw_probe_rseq_lock_local(&state);
            qpw_probe_rseq_lock_local_try(&state).expect("a bound thread's lock_local");
        }
        assert_eq!(*state.lock_local().expect("the slot"), 4);
        let probe: fn(&PerCpu<u64, RseqLock>) = qpw_probe_rseq_lock_local;
        let probe_try: fn(&PerCpu<u64, RseqLock>) -> qpw_core::Result<()> =
            qpw_probe_rseq_lock_local_try;
        let mut place = ResultPlace::uninit();
        let state_at = &state as *const _ as usize;
        vec![
            check(exe, &RSEQ_LOCK_LOCAL, probe as usize, &[state_at]),
            check(
                exe,
                &RSEQ_LOCK_LOCAL_TRY,
                probe_try as usize,
                &[place.as_mut_ptr() as usize, state_at],
            ),
        ]
    }

    /// The floor, on the calling thread (pinned, so that its counter is one CPU's).
    fn floor(exe: &Path) -> Result<(), String> {
        let before = qpw_core::current_affinity().expect("the thread's affinity");
        let cpu = qpw_core::allowed_cpus()
            .expect("the allowed CPUs")
            .iter()
            .last()
            .expect("a CPU");
        qpw_core::pin_current_thread(cpu).expect("pin to an allowed CPU");
        let Some(floor) = Floor::new() else {
            qpw_core::set_current_affinity(&before).expect("the affinity back");
            println!("owner_path: the floor skipped: this thread has no rseq registration");
            return Ok(());
        };
        qpw_probe_floor(&floor);
        qpw_probe_floor(&floor);
        assert_eq!(floor.total(), 2);
        let probe: fn(&Floor) = qpw_probe_floor;
        let outcome = check(exe, &FLOOR, probe as usize, &[&floor as *const _ as usize]);
        qpw_core::set_current_affinity(&before).expect("the affinity back");
        outcome
    }

    #[test]
    fn the_owner_paths_have_no_atomics_and_keep_their_length() {
        if cfg!(debug_assertions) {
            println!(
                "owner_path: skipped: this counts the release build's instructions; run \
                 `cargo test --release -p qpw-tests --test owner_path`"
            );
            return;
        }
        if std::process::Command::new("objdump")
            .arg("--version")
            .output()
            .is_err()
        {
            println!("owner_path: skipped: objdump is missing (Debian's binutils has it)");
            return;
        }
        let exe = std::env::current_exe().expect("the test binary");
        let mut outcomes = vec![floor(&exe)];
        outcomes.extend(default_lock(
            &exe,
            Policy::Remote,
            &[
                &REMOTE_LOCK_LOCAL,
                &REMOTE_LOCK_LOCAL_TRY,
                &REMOTE_BOUND_SLOT,
            ],
        ));
        outcomes.extend(default_lock(
            &exe,
            Policy::Queue,
            &[&QUEUE_LOCK_LOCAL, &QUEUE_LOCK_LOCAL_TRY],
        ));
        if RseqLock::kind() == LocalLockKind::Rseq {
            outcomes.extend(default_lock(
                &exe,
                Policy::Fenced,
                &[
                    &FENCED_LOCK_LOCAL,
                    &FENCED_LOCK_LOCAL_TRY,
                    &FENCED_BOUND_SLOT,
                ],
            ));
            outcomes.extend(rseq_lock(&exe));
        } else {
            println!(
                "owner_path: fenced and rseq paths skipped: no restartable sequences here \
                 ({}), so those locks take the FairLock protocol",
                qpw_core::rseq::status()
            );
        }
        let failures: Vec<String> = outcomes.into_iter().filter_map(Result::err).collect();
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }
}
