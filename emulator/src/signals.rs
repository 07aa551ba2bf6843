//! Ctrl-C as rt-tests handles it, and one more: the first SIGINT, SIGTERM or SIGHUP asks the run
//! to stop (the probes finish, the summary and the JSON are written, the run is marked
//! interrupted); a second Ctrl-C (SIGINT) ends the process at once, after the exit hooks have
//! put back what the run changed on the system.
//!
//! What counts as that second request: a Ctrl-C after the first, or a signal other than the
//! first. Not a repeated SIGTERM or SIGHUP: `timeout` and service managers send SIGTERM to the
//! process and then to its process group, and a closed terminal sends SIGHUP to each process of
//! its session, so one request arrives twice, and a run asked to stop that way still writes its
//! results. Nor the first signal again within [`SAME_REQUEST`] (`timeout -s INT`, the same
//! double delivery).
//!
//! A standard output that can no longer be written (its reader has gone: `qpw-emu ... | head`,
//! or the terminal hung up) asks the run to stop the same way ([`request_stop_stdout_closed`], from
//! [`crate::out`]): SIGPIPE is ignored, so such a write fails with `EPIPE` instead of killing
//! the process before it has put back what it changed (RT throttling, a tracefs mount).
//!
//! The signals are taken by a `signal-hook` thread, not by a handler, so that what they do is
//! ordinary code: set the flag, wake the main thread (which sleeps in [`wait`] until the run's
//! end, a signal, or a probe thread's [`wake`]), and on the second signal run the hooks.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGHUP, SIGINT, SIGPIPE, SIGTERM};
use signal_hook::iterator::Signals;

/// A clean-up that must run even when a second Ctrl-C ends the process.
pub type ExitHook = Box<dyn Fn() + Send + Sync>;

struct State {
    interrupted: AtomicBool,
    /// Set (under the hooks' lock) when a forced exit has begun running the hooks.
    exiting: AtomicBool,
    /// The first signal's number (0: none yet).
    first: AtomicI32,
    /// When the first signal came.
    first_at: OnceLock<Instant>,
    /// Bumped by every wake-up, so a waiter can tell one happened.
    wakes: Mutex<u64>,
    wake: Condvar,
    hooks: Mutex<Vec<ExitHook>>,
}

fn state() -> &'static State {
    static STATE: OnceLock<State> = OnceLock::new();
    STATE.get_or_init(|| State {
        interrupted: AtomicBool::new(false),
        exiting: AtomicBool::new(false),
        first: AtomicI32::new(0),
        first_at: OnceLock::new(),
        wakes: Mutex::new(0),
        wake: Condvar::new(),
        hooks: Mutex::new(Vec::new()),
    })
}

/// The exit status of a run ended by a second Ctrl-C (128 + SIGINT, as a shell reports it).
pub const FORCED_EXIT: i32 = 130;

/// The first signal again this soon after it is the same request delivered twice (to the
/// process and to its group), not a second Ctrl-C.
pub const SAME_REQUEST: Duration = Duration::from_millis(50);

/// Starts taking SIGINT, SIGTERM and SIGHUP (once per process; later calls do nothing). If the
/// signals cannot be taken, they keep their default action (the process ends), and the caller
/// is told.
pub fn install() -> std::io::Result<()> {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("qpw-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                on_signal(signal);
            }
        })?;
    let _ = INSTALLED.set(());
    Ok(())
}

/// Takes the first request to stop (`reason`: the signal's number, or [`SIGPIPE`] for a closed
/// standard output); whether it was the first.
fn first_request(reason: i32) -> bool {
    let s = state();
    if s.first
        .compare_exchange(0, reason, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return false;
    }
    let _ = s.first_at.set(Instant::now());
    s.interrupted.store(true, Ordering::SeqCst);
    wake();
    true
}

/// Asks the run to stop as a first signal does, because its standard output cannot be written
/// any more (its reader has gone); later requests, and signals after it, are counted as after
/// a first signal.
pub fn request_stop_stdout_closed() {
    first_request(SIGPIPE);
}

fn on_signal(signal: i32) {
    let s = state();
    if first_request(signal) {
        return;
    }
    let first = s.first.load(Ordering::SeqCst);
    let since_first = s.first_at.get().map_or(Duration::ZERO, Instant::elapsed);
    if !forces_exit(first, signal, since_first) {
        return;
    }
    eprintln!("second interrupt: exiting now");
    run_exit_hooks();
    std::process::exit(FORCED_EXIT);
}

/// Whether `signal`, coming `since_first` after the `first`, ends the process at once (see the
/// module docs).
fn forces_exit(first: i32, signal: i32, since_first: Duration) -> bool {
    if signal == first && (signal == SIGTERM || signal == SIGHUP) {
        return false;
    }
    signal != first || since_first >= SAME_REQUEST
}

/// Runs the exit hooks (newest first) and forgets them, until none is left: another thread of
/// the run may register one while they run (it runs its own from then on, [`on_forced_exit`]).
fn run_exit_hooks() {
    loop {
        let hooks = {
            let mut list = state().hooks.lock().unwrap_or_else(|e| e.into_inner());
            state().exiting.store(true, Ordering::SeqCst);
            std::mem::take(&mut *list)
        };
        if hooks.is_empty() {
            return;
        }
        for hook in hooks.iter().rev() {
            hook();
        }
    }
}

/// Registers a clean-up for a forced exit (a second Ctrl-C). The caller still undoes its change
/// on the normal paths (a guard's `Drop`); a hook must therefore be harmless to run after that.
/// Once the forced exit has begun, the hook runs at once, in the caller.
pub fn on_forced_exit(hook: ExitHook) {
    let mut list = state().hooks.lock().unwrap_or_else(|e| e.into_inner());
    if state().exiting.load(Ordering::SeqCst) {
        drop(list);
        hook();
    } else {
        list.push(hook);
    }
}

/// Whether a forced exit (a second Ctrl-C) has begun: nothing new may be changed on the
/// system from then on.
pub fn exiting() -> bool {
    state().exiting.load(Ordering::SeqCst)
}

/// Whether SIGINT, SIGTERM or SIGHUP arrived, or the standard output was closed.
pub fn interrupted() -> bool {
    state().interrupted.load(Ordering::SeqCst)
}

/// What asked the run to stop: `SIGINT` (Ctrl-C; also before anything came), `SIGTERM`,
/// `SIGHUP`, or `stdout closed`.
pub fn stop_signal() -> &'static str {
    match state().first.load(Ordering::SeqCst) {
        SIGTERM => "SIGTERM",
        SIGHUP => "SIGHUP",
        SIGPIPE => "stdout closed",
        _ => "SIGINT",
    }
}

/// What stopped the run, for its report: `interrupted (SIGINT)`, `interrupted (SIGTERM)`,
/// `interrupted (SIGHUP)` or `interrupted (stdout closed)`.
pub fn stopped_by() -> String {
    format!("interrupted ({})", stop_signal())
}

/// Wakes a thread sleeping in [`wait`] (a probe thread that stopped early calls it).
pub fn wake() {
    let s = state();
    *s.wakes.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    s.wake.notify_all();
}

/// Sleeps until `deadline` (`None`: no deadline), a signal, or a [`wake`], whichever comes
/// first. Returns at once when a signal has already arrived.
pub fn wait(deadline: Option<Instant>) {
    let s = state();
    let mut wakes = s.wakes.lock().unwrap_or_else(|e| e.into_inner());
    let seen = *wakes;
    while *wakes == seen && !interrupted() {
        match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return;
                }
                wakes = s
                    .wake
                    .wait_timeout(wakes, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            None => {
                wakes = s.wake.wait(wakes).unwrap_or_else(|e| e.into_inner());
            }
        }
    }
}

/// [`wait`] for at most `span`.
pub fn wait_for(span: Duration) {
    wait(Instant::now().checked_add(span));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_second_signal_forces_the_exit() {
        let later = SAME_REQUEST * 4;
        let at_once = Duration::from_millis(1);
        // A second Ctrl-C.
        assert!(forces_exit(SIGINT, SIGINT, later));
        // The same Ctrl-C delivered to the process and to its group (`timeout -s INT`).
        assert!(!forces_exit(SIGINT, SIGINT, at_once));
        // `timeout`'s SIGTERM, twice, or a service manager's repeated one.
        assert!(!forces_exit(SIGTERM, SIGTERM, at_once));
        assert!(!forces_exit(SIGTERM, SIGTERM, later));
        // Another signal than the first.
        assert!(forces_exit(SIGINT, SIGTERM, at_once));
        assert!(forces_exit(SIGTERM, SIGINT, at_once));
        // A hung-up terminal's SIGHUP, to the process and to its group.
        assert!(!forces_exit(SIGHUP, SIGHUP, later));
        assert!(forces_exit(SIGHUP, SIGINT, at_once));
        // A closed stdout, then Ctrl-C: the user wants out.
        assert!(forces_exit(SIGPIPE, SIGINT, later));
    }
}
