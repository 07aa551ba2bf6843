//! What the loom models of `loom_fenced` and `loom_rseq` share: the check that a model with one
//! step of its protocol left out fails as the protocol's argument predicts.

/// What a loom model's conservation assertion says when it fails: an increment lost or counted
/// twice. The models of `loom_fenced` and `loom_rseq` end with it.
pub(crate) const LOOM_CONSERVATION: &str = "every increment lands exactly once";

/// Runs `broken`, a loom model with one step of a protocol left out (`what` names it), and
/// checks that loom fails it the way two holders of one lock would: unordered accesses to the
/// guarded data (loom's "Causality violation") or the model's [`LOOM_CONSERVATION`] assertion.
/// A model that passes without the step does not need it, and this panics saying so.
pub(crate) fn assert_loom_catches(what: &dyn std::fmt::Debug, broken: impl FnOnce()) {
    let Err(failure) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(broken)) else {
        panic!("loom found no failure with {what:?}: the model does not need that step");
    };
    let message = failure
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| failure.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(
        message.contains("Causality violation") || message.contains(LOOM_CONSERVATION),
        "with {what:?} loom failed, but not with two holders: {message}"
    );
}
