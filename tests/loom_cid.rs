//! Loom models of [`PerCid`]: state per concurrency id, slots made on first use and published
//! with a compare-and-swap, each behind an atomic lock, walked from the caller. Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p qpw-tests --test loom_cid`
//! (see `.ci/loom`).
//!
//! The kernel's part is a thread's id (`rseq::mock::set_cid`): it changes when the thread is
//! descheduled, and a freed id goes to another thread, so two threads may reach one slot (one
//! still holding it with the id it had, the other with that id now), and two threads may find
//! an id's slot not made yet at the same moment. Each model ends in a conservation assertion:
//! every increment lands exactly once. With the slot published by a plain store instead of a
//! compare-and-swap (`Mutation::SlotStoredBlindly`), two makers of one slot each publish theirs
//! and the increment made in the one overwritten is lost: the model of two first uses fails.

#![cfg(loom)]

mod loom_common;

use std::sync::Arc;

use loom::thread;

use loom_common::Failure;
use qpw_core::rseq::mock::{set_cid, with_mutation, Mutation};
use qpw_core::{CpuSpec, PerCid, Policy, Qpw};

const CONSERVATION: &str = loom_common::LOOM_CONSERVATION;

fn state() -> Arc<PerCid<u32>> {
    let qpw = Qpw::builder()
        .cpus(CpuSpec::Logical(1))
        .policy(Policy::Remote)
        .build()
        .unwrap();
    Arc::new(qpw.per_cid(|_| 0u32))
}

/// With id `cid`, adds one through `lock_local`.
fn add(state: &PerCid<u32>, cid: usize) {
    set_cid(Some(cid));
    *state.lock_local().unwrap() += 1;
}

/// The total, read by a walk after every thread is done.
fn total(state: &PerCid<u32>) -> u32 {
    let mut total = 0;
    state.read_each(|_, n| total += *n).unwrap();
    total
}

/// Two threads find id 0's slot not made yet and make it at once: one slot is published, and
/// both increments land in it.
fn two_first_uses() {
    loom::model(|| {
        let state = state();
        let other = {
            let state = state.clone();
            thread::spawn(move || add(&state, 0))
        };
        add(&state, 0);
        other.join().unwrap();
        assert_eq!(total(&state), 2, "{CONSERVATION}");
        assert_eq!(state.slots(), 1);
    });
}

#[test]
fn loom_cid_two_first_uses_of_one_id() {
    two_first_uses();
}

/// A thread adds with id 0, then (descheduled) comes back with id 1 and adds again, while a
/// second thread, given the freed id 0, adds, and a third drains every id from the caller:
/// what the drain took plus what is left is every increment.
#[test]
fn loom_cid_ids_change_hands_during_a_drain() {
    loom::model(|| {
        let state = state();
        let mover = {
            let state = state.clone();
            thread::spawn(move || {
                add(&state, 0);
                add(&state, 1);
            })
        };
        let taker = {
            let state = state.clone();
            thread::spawn(move || add(&state, 0))
        };
        let drained: u32 = state
            .take_each(std::mem::take)
            .unwrap()
            .into_iter()
            .map(|(_, n)| n)
            .sum();
        mover.join().unwrap();
        taker.join().unwrap();
        assert_eq!(drained + total(&state), 3, "{CONSERVATION}");
    });
}

/// A holder preempted with its slot held while another thread, now with that id, asks for
/// it: the second waits on the lock instead of entering with it.
#[test]
fn loom_cid_a_preempted_holder_excludes_the_ids_next_thread() {
    loom::model(|| {
        let state = state();
        let holder = {
            let state = state.clone();
            thread::spawn(move || {
                set_cid(Some(0));
                let mut guard = state.lock_local().unwrap();
                thread::yield_now();
                *guard += 1;
            })
        };
        add(&state, 0);
        holder.join().unwrap();
        assert_eq!(total(&state), 2, "{CONSERVATION}");
    });
}

/// Published with a plain store, the slot one maker made is lost with its increment.
#[test]
fn loom_cid_slots_are_published_with_a_compare_and_swap() {
    let mutation = Mutation::SlotStoredBlindly;
    loom_common::assert_loom_catches(&mutation, Failure::TwoHolders, || {
        with_mutation(mutation, two_first_uses)
    });
}
