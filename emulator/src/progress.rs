//! A one-line progress display on stderr for runs longer than a couple of seconds; off with
//! `-q` or when stderr is not a terminal (so logs and CI output stay clean).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::sink::Sink;

/// The display of one timed phase.
#[derive(Debug)]
pub struct Progress {
    label: String,
    total: Duration,
    start: Instant,
    enabled: bool,
}

impl Progress {
    /// A display for a phase of `total` length, shown only when it is long enough to need one.
    pub fn new(label: impl Into<String>, total: Duration, quiet: bool) -> Self {
        Self::part(label, Duration::ZERO, total, quiet)
    }

    /// A display for one part of a longer run: `done` of the run's `total` is behind us when
    /// this part starts (the experiment's scenario rounds each show the whole run's progress).
    pub fn part(label: impl Into<String>, done: Duration, total: Duration, quiet: bool) -> Self {
        Self {
            label: label.into(),
            total,
            start: Instant::now()
                .checked_sub(done)
                .unwrap_or_else(Instant::now),
            enabled: !quiet && total >= Duration::from_secs(2) && std::io::stderr().is_terminal(),
        }
    }

    /// Whether the line is drawn at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Redraws the line.
    pub fn tick(&self) {
        if !self.enabled {
            return;
        }
        let done = self.start.elapsed().min(self.total);
        let frac = done.as_secs_f64() / self.total.as_secs_f64().max(1e-9);
        let bar = (frac * 30.0) as usize;
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r{:<28} [{}{}] {:>6.1}/{:.1} s",
            self.label,
            "#".repeat(bar),
            " ".repeat(30 - bar.min(30)),
            done.as_secs_f64(),
            self.total.as_secs_f64()
        );
        let _ = err.flush();
    }

    /// Clears the line.
    pub fn finish(&self) {
        if self.enabled {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{:80}\r", "");
            let _ = err.flush();
        }
    }
}

/// Waits for the end of a run of `duration` (until Ctrl-C without one), drawing the progress
/// line of `label` unless the sink is quiet; returns when the wait began.
pub fn wait_for(label: &str, duration: Option<Duration>, sink: &Sink) -> Instant {
    let progress = Progress::new(label, duration.unwrap_or(Duration::MAX), sink.is_quiet());
    let start = Instant::now();
    while duration.is_none_or(|d| start.elapsed() < d) && !crate::rt::interrupted() {
        if duration.is_some() {
            progress.tick();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    progress.finish();
    start
}
