//! Ctrl-C as rt-tests handles it, and one more: the first SIGINT or SIGTERM asks the run to stop
//! (the probes finish, the summary and the JSON are written, the run is marked interrupted);
//! a second one ends the process at once, after the exit hooks have put back what the run
//! changed on the system.
//!
//! The signals are taken by a `signal-hook` thread, not by a handler, so that what they do is
//! ordinary code: set the flag, wake the main thread (which sleeps in [`wait`] until the run's
//! end, a signal, or a probe thread's [`wake`]), and on the second signal run the hooks.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// A clean-up that must run even when a second Ctrl-C ends the process.
pub type ExitHook = Box<dyn Fn() + Send + Sync>;

struct State {
    interrupted: AtomicBool,
    signals_seen: AtomicUsize,
    /// Bumped by every wake-up, so a waiter can tell one happened.
    wakes: Mutex<u64>,
    wake: Condvar,
    hooks: Mutex<Vec<ExitHook>>,
}

fn state() -> &'static State {
    static STATE: OnceLock<State> = OnceLock::new();
    STATE.get_or_init(|| State {
        interrupted: AtomicBool::new(false),
        signals_seen: AtomicUsize::new(0),
        wakes: Mutex::new(0),
        wake: Condvar::new(),
        hooks: Mutex::new(Vec::new()),
    })
}

/// The exit status of a run ended by a second Ctrl-C (128 + SIGINT, as a shell reports it).
pub const FORCED_EXIT: i32 = 130;

/// Starts taking SIGINT and SIGTERM (once per process; later calls do nothing). If the signals
/// cannot be taken, they keep their default action (the process ends), and the caller is told.
pub fn install() -> std::io::Result<()> {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    let mut signals = Signals::new([SIGINT, SIGTERM])?;
    std::thread::Builder::new()
        .name("qpw-signals".into())
        .spawn(move || {
            for _ in signals.forever() {
                on_signal();
            }
        })?;
    let _ = INSTALLED.set(());
    Ok(())
}

fn on_signal() {
    let s = state();
    if s.signals_seen.fetch_add(1, Ordering::SeqCst) == 0 {
        s.interrupted.store(true, Ordering::SeqCst);
        wake();
        return;
    }
    eprintln!("second interrupt: exiting now");
    run_exit_hooks();
    std::process::exit(FORCED_EXIT);
}

/// Runs the exit hooks (newest first) and forgets them.
fn run_exit_hooks() {
    let hooks = std::mem::take(&mut *state().hooks.lock().unwrap_or_else(|e| e.into_inner()));
    for hook in hooks.iter().rev() {
        hook();
    }
}

/// Registers a clean-up for a forced exit (a second Ctrl-C). The caller still undoes its change
/// on the normal paths (a guard's `Drop`); a hook must therefore be harmless to run after that.
pub fn on_forced_exit(hook: ExitHook) {
    state()
        .hooks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(hook);
}

/// Whether SIGINT or SIGTERM arrived.
pub fn interrupted() -> bool {
    state().interrupted.load(Ordering::SeqCst)
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
