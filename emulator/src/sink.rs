//! One command's output sink: made once from the command line, passed where output is produced.
//!
//! rt-tests' tools decide once, from their options, what they say (`-q`, `-v`) and keep the
//! warnings of their set-up to say with their results; a probe's set-up, its load, its trace
//! and its report each produce output, and they ask the sink rather than each carrying a
//! `quiet` flag of its own. The sink holds:
//!
//! - **quiet**: our own lines on standard error (the set-up's warnings as they happen, the
//!   isolation's report, the trace's start) are left out; what the tool prints as its result is
//!   not (the commands decide that: `-q` changes cyclictest's output, not only ours);
//! - **verbose**: the tool's `-v`, for those that have it;
//! - **the warnings** of the run, in the order they happened, each once: said on standard
//!   error as they are recorded (unless quiet, as rt-tests says its own as it meets them), and
//!   kept for the report and the JSON.
//!
//! Everything goes through [`crate::out`], so a closed standard output still stops the run in
//! order.

/// What one command says, and the warnings its run gathered.
#[derive(Debug, Default, Clone)]
pub struct Sink {
    /// `-q`: our own lines on standard error are left out.
    quiet: bool,
    /// `-v`, for the tools that have it.
    verbose: bool,
    /// The warnings so far, in order, each once.
    warnings: Vec<String>,
}

impl Sink {
    /// The sink of a command run with `quiet` (`-q`).
    pub fn new(quiet: bool) -> Self {
        Self {
            quiet,
            ..Self::default()
        }
    }

    /// The same sink, with the tool's `-v`.
    pub fn with_verbose(self, verbose: bool) -> Self {
        Self { verbose, ..self }
    }

    /// Whether our own lines are left out (`-q`).
    pub fn is_quiet(&self) -> bool {
        self.quiet
    }

    /// Whether the tool's `-v` was given.
    pub fn is_verbose(&self) -> bool {
        self.verbose
    }

    /// Records one warning, and says it on stderr unless quiet; a warning already recorded
    /// (the same step failing again in a later scenario) is neither repeated nor said again.
    pub fn warn(&mut self, message: impl Into<String>) {
        let message = message.into();
        if self.warnings.contains(&message) {
            return;
        }
        if !self.quiet {
            eprintln!("warning: {message}");
        }
        self.keep(message);
    }

    /// Records one warning without saying it now: the caller says it where it fits (oslat's
    /// missing trace marker, after rt-tests' own lines of a threshold stop).
    pub fn keep(&mut self, message: impl Into<String>) {
        let message = message.into();
        if !self.warnings.contains(&message) {
            self.warnings.push(message);
        }
    }

    /// Takes warnings from elsewhere (the probe threads), without repeating them.
    pub fn warn_all(&mut self, more: impl IntoIterator<Item = String>) {
        for m in more {
            self.warn(m);
        }
    }

    /// The warnings, in the order they were recorded.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Says a line of ours on standard error, unless quiet.
    pub fn say(&self, line: std::fmt::Arguments<'_>) {
        if !self.quiet {
            eprintln!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Sink;

    #[test]
    fn a_warning_is_kept_once_in_order_quiet_or_not() {
        for quiet in [false, true] {
            let mut sink = Sink::new(quiet);
            sink.warn("b");
            sink.warn_all(["a".to_string(), "b".to_string(), "c".to_string()]);
            assert_eq!(sink.warnings(), ["b", "a", "c"]);
            assert_eq!(sink.is_quiet(), quiet);
        }
        assert!(Sink::new(false).with_verbose(true).is_verbose());
    }
}
