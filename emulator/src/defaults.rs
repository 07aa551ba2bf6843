//! Defaults that the command line shows and a command also uses, kept apart so that [`cli`]
//! need not import the command: the command line's layer stays above the commands'.
//!
//! Only a default that both sides need lives here; one that only the command line shows stays
//! in its `#[arg(default_value = ...)]`.
//!
//! [`cli`]: crate::cli

/// The probe's local operation period in the default run: an owner busy on its lock (a few
/// turns of the probe's loop), as a service's thread that touches its per-CPU state for every
/// request is. It is what lets a fenced-mode owner answer a requester's flag in a fraction of a
/// microsecond instead of taking the fence's interrupt.
pub const BUSY_OWNER: &str = "100ns";
