//! What the loom models of `loom_fenced` and `loom_rseq` share: the check that a model with one
//! step of its protocol left out fails as the protocol's argument predicts.
//!
//! The models share their locks through `std::sync::Arc`, not loom's: the reference count is no
//! part of any protocol here, and when loom stops a model (a deadlock, a failed assertion) a
//! loom `Arc` dropped while the thread unwinds asks loom's scheduler for a branch and aborts the
//! whole test process ("panic in a destructor during cleanup"), so that no mutation test could
//! see the failure it expects.

/// What a loom model's conservation assertion says when it fails: an increment lost or counted
/// twice. The models of `loom_fenced` and `loom_rseq` end with it.
pub(crate) const LOOM_CONSERVATION: &str = "every increment lands exactly once";

/// How a model with one step left out must fail (each test file uses some of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)]
pub(crate) enum Failure {
    /// Two holders of one lock: unordered accesses to the guarded data (loom's "Causality
    /// violation") or the model's [`LOOM_CONSERVATION`] assertion.
    TwoHolders,
    /// A lost wake: every thread asleep, which loom reports as a deadlock.
    LostWake,
    /// A CPU's answer moved backwards (the mock's check of the answer cell).
    AnswerWentBack,
}

/// Runs `broken`, a loom model with one step of a protocol left out (`what` names it), and
/// checks that loom fails it the way `expected` says. A model that passes without the step
/// does not need it, and this panics saying so.
pub(crate) fn assert_loom_catches(
    what: &dyn std::fmt::Debug,
    expected: Failure,
    broken: impl FnOnce(),
) {
    let Err(failure) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(broken)) else {
        panic!("loom found no failure with {what:?}: the model does not need that step");
    };
    let message = failure
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| failure.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    eprintln!("CAUGHT: {message}");
    let matches = match expected {
        Failure::TwoHolders => {
            message.contains("Causality violation") || message.contains(LOOM_CONSERVATION)
        }
        Failure::LostWake => message.contains("deadlock"),
        Failure::AnswerWentBack => message.contains(qpw_core::rseq::mock::ANSWER_WENT_BACK),
    };
    assert!(
        matches,
        "with {what:?} loom failed, but not as {expected:?}: {message}"
    );
}
