//! Standard output and standard error that a run survives losing.
//!
//! `std`'s `println!` panics when its write fails, and SIGPIPE at its default action ends the
//! process at the first write to a pipe whose reader has gone (`qpw-emu ... | head -1`): either
//! way the run ends without putting back what it changed on the system (RT throttling, a
//! tracefs mount, a cgroup) and without writing its JSON. So qpw-emu ignores SIGPIPE
//! ([`ignore_sigpipe`]) and prints through this module: the crate's `print!`, `println!`,
//! `eprint!` and `eprintln!` are its own (defined in `lib.rs`, where they shadow `std`'s for
//! every module), and call [`stdout`] and [`stderr`].
//!
//! A write to standard output that fails (`EPIPE`: the reader has gone; `EIO`: the terminal
//! hung up) is an orderly stop, as a first Ctrl-C: the run is asked to stop
//! ([`crate::signals::request_stop_stdout_closed`]), puts back what it changed, writes its JSON
//! files and is marked `interrupted (stdout closed)`. Standard output is then pointed at
//! `/dev/null`, so that what is printed after (the summary, from any thread) is dropped without
//! an error. A write to standard error that fails is dropped: there is nobody left to tell.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once standard output has failed (and points at `/dev/null`).
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);

/// Ignores SIGPIPE, so that a write to a pipe whose reader has gone fails with `EPIPE` (taken
/// here as an orderly stop) instead of ending the process. Children started with
/// `std::process::Command` get the default action back (the standard library resets it).
pub fn ignore_sigpipe() {
    // SAFETY: setting a signal's action to SIG_IGN has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Writes `args` to standard output, as `print!` (the crate's `print!` and `println!` call
/// it); a failed write stops the run (see the module docs).
pub fn stdout(args: std::fmt::Arguments<'_>) {
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let result = std::io::stdout().lock().write_fmt(args);
    check_stdout(result);
}

/// Takes the result of a write to standard output made directly (a `write!` to
/// `std::io::stdout()`): a failure stops the run as in [`stdout`]. Returns whether it was
/// written.
pub fn check_stdout<T>(result: std::io::Result<T>) -> bool {
    match result {
        Ok(_) => true,
        Err(_) => {
            stdout_gone();
            false
        }
    }
}

/// Whether standard output has failed (and the run was asked to stop).
pub fn stdout_closed() -> bool {
    STDOUT_GONE.load(Ordering::Relaxed)
}

/// Writes `args` to standard error, as `eprint!` (the crate's `eprint!` and `eprintln!` call
/// it); a failed write is dropped.
pub fn stderr(args: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

#[cold]
fn stdout_gone() {
    if STDOUT_GONE.swap(true, Ordering::SeqCst) {
        return;
    }
    // What is still buffered cannot be written either: point the descriptor at /dev/null, so
    // that the buffer's flush and every later write succeed, whoever writes.
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd as _;
        // SAFETY: both descriptors are open; `dup2` replaces descriptor 1 atomically.
        unsafe { libc::dup2(null.as_raw_fd(), libc::STDOUT_FILENO) };
    }
    let _ = std::io::stdout().flush();
    crate::signals::request_stop_stdout_closed();
}
