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
//! - **the JSON's destination** (`--json FILE`, `-` for standard output), checked writable when
//!   the command's plan is made, before anything is changed or measured;
//! - **the warnings** of the run, in the order they happened, each once; and every line a
//!   command prints to say a warning: ours (`warning: ...`) and the tool's own (cyclictest's
//!   `WARN: ...`, said as cyclictest says them and not gathered: they are the tool's output,
//!   about its options).
//!
//! Warnings are said in the order rt-tests says its own: as they are met (its `warn()` writes
//! at once), so a set-up warning comes before the measuring and after the lines that came
//! before it. One kind waits: a warning whose place is after the tool's own lines of an event
//! ([`defer`](Sink::defer): oslat's missing trace marker, said after its two lines of a
//! threshold stop, [`say_deferred`](Sink::say_deferred)). The report and the JSON then carry
//! ours ([`warnings`](Sink::warnings), [`print_warnings`](Sink::print_warnings)). A check
//! that fails inside a report's text (`pool`'s and `resctrl`'s `warning:` lines among their
//! figures) is part of that text, not a warning of the run.
//!
//! Everything goes through [`crate::out`], so a closed standard output still stops the run in
//! order.

use std::path::{Path, PathBuf};

use anyhow::Result;

/// Where a command's JSON goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonOut {
    /// `--json -`.
    Stdout,
    /// `--json FILE`.
    File(PathBuf),
}

impl JsonOut {
    /// The destination `flag` (`--json`) names, if given, once it is known writable: a file
    /// that cannot be written is refused now, before the run, not after it.
    pub fn checked(flag: &str, path: Option<&Path>) -> Result<Option<JsonOut>> {
        let Some(path) = path else {
            return Ok(None);
        };
        crate::validate::output_file(flag, path)?;
        Ok(Some(if path.as_os_str() == "-" {
            JsonOut::Stdout
        } else {
            JsonOut::File(path.to_path_buf())
        }))
    }
}

/// What one command says, and the warnings its run gathered.
#[derive(Debug, Default, Clone)]
pub struct Sink {
    /// `-q`: our own lines on standard error are left out.
    quiet: bool,
    /// `-v`, for the tools that have it.
    verbose: bool,
    /// Where the JSON goes; `None`: no JSON.
    json: Option<JsonOut>,
    /// The warnings so far, in order, each once.
    warnings: Vec<String>,
    /// Those of [`warnings`](Self::warnings) recorded to be said later, not yet said.
    deferred: Vec<String>,
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

    /// The same sink, writing the command's JSON to `json` (see [`JsonOut::checked`]).
    pub fn with_json(self, json: Option<JsonOut>) -> Self {
        Self { json, ..self }
    }

    /// Whether the command writes JSON.
    pub fn wants_json(&self) -> bool {
        self.json.is_some()
    }

    /// Writes the command's JSON document where `--json` said, if it did.
    pub fn write_json<T: serde::Serialize>(&self, doc: &T) -> Result<()> {
        match &self.json {
            None => Ok(()),
            Some(JsonOut::Stdout) => crate::json::print(doc),
            Some(JsonOut::File(path)) => crate::json::write(path, doc),
        }
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
        self.say_warning(&message);
        self.warnings.push(message);
    }

    /// Records one warning to be said later, by [`say_deferred`](Self::say_deferred), where it
    /// fits among the tool's own lines (oslat's missing trace marker, after rt-tests' two lines
    /// of a threshold stop).
    pub fn defer(&mut self, message: impl Into<String>) {
        let message = message.into();
        if !self.warnings.contains(&message) {
            self.deferred.push(message.clone());
            self.warnings.push(message);
        }
    }

    /// Says, unless quiet, the warnings recorded by [`defer`](Self::defer) and not said yet.
    pub fn say_deferred(&mut self) {
        for message in std::mem::take(&mut self.deferred) {
            self.say_warning(&message);
        }
    }

    /// Says one warning of ours on standard error, unless quiet: the one place that prints
    /// `warning: ...` as it happens.
    fn say_warning(&self, message: &str) {
        if !self.quiet {
            eprintln!("warning: {message}");
        }
    }

    /// Says one of the tool's own warnings, in its own words (cyclictest's `WARN: ...` lines
    /// about its options and its set-up), at once as the tool does and whether quiet or not:
    /// they are the tool's output, not ours.
    pub fn tool_warn(&self, line: std::fmt::Arguments<'_>) {
        eprintln!("WARN: {line}");
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

    /// Prints the run's warnings on standard output, a line each, as a report ends with them
    /// (`qpw-emu run`'s, after its notes).
    pub fn print_warnings(&self) {
        for w in &self.warnings {
            println!("warning: {w}");
        }
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

    #[test]
    fn a_deferred_warning_is_kept_in_its_place_and_said_once() {
        let mut sink = Sink::new(false);
        sink.warn("a");
        sink.defer("later");
        sink.defer("later");
        sink.warn("b");
        assert_eq!(sink.warnings(), ["a", "later", "b"]);
        assert_eq!(sink.deferred, ["later"]);
        sink.say_deferred();
        assert!(sink.deferred.is_empty());
        // Said already as a plain warning: not deferred again.
        sink.defer("a");
        assert!(sink.deferred.is_empty());
    }

    #[test]
    fn the_json_goes_where_json_says_once_checked() {
        use super::JsonOut;
        let dir = std::env::temp_dir().join(format!("qpw-sink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("out.json");
        let out = JsonOut::checked("--json", Some(&file)).unwrap();
        assert_eq!(out, Some(JsonOut::File(file.clone())));
        assert_eq!(
            JsonOut::checked("--json", Some("-".as_ref())).unwrap(),
            Some(JsonOut::Stdout)
        );
        assert_eq!(JsonOut::checked("--json", None).unwrap(), None);
        let missing = dir.join("no/such/dir/out.json");
        let refused = JsonOut::checked("--json", Some(&missing)).unwrap_err();
        assert!(refused.to_string().starts_with("--json "), "{refused}");

        let sink = Sink::new(true).with_json(out);
        assert!(sink.wants_json());
        sink.write_json(&[1, 2]).unwrap();
        let written: Vec<u8> =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(written, [1, 2]);
        assert!(!Sink::new(true).wants_json());
        Sink::new(true).write_json(&[3]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
