//! What the main thread shows while the threads measure: cyclictest's status lines, redrawn in
//! place, `-v`'s values, the `-F` named pipe, and our progress line.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::progress::Progress;

use super::{Live, ThreadSpec, Watch, VALBUF};

/// cyclictest's status lines, redrawn in place (`\x1b[NA`) every tick; the last drawing stays
/// on the screen. `policy` is the line above them.
#[derive(Debug)]
pub struct LiveLines {
    /// The threads' settings.
    pub specs: Vec<ThreadSpec>,
    /// `-N`.
    pub nsecs: bool,
    /// `policy: fifo: loadavg: ...`'s policy part.
    pub policy: String,
    /// `-M`: redraw only after a new maximum.
    pub refresh_on_max: bool,
    /// `-q`: draw nothing.
    pub quiet: bool,
    /// `-v`: print `thread:cycle:value` lines instead.
    pub verbose: Option<Verbose>,
    drawn: bool,
    maxima: Vec<u64>,
}

/// `-v`'s state: how far each thread's values were printed, and `-o`'s reduction.
#[derive(Debug)]
pub struct Verbose {
    /// Print the largest of every this many values.
    pub reduce: u64,
    read: Vec<u64>,
    red_max: Vec<(u64, u64)>,
    red_count: Vec<u64>,
}

impl Verbose {
    /// `-v` with `-o reduce`.
    pub fn new(threads: usize, reduce: u64) -> Self {
        Self {
            reduce: reduce.max(1),
            read: vec![0; threads],
            red_max: vec![(0, 0); threads],
            red_count: vec![0; threads],
        }
    }

    /// Prints the values each thread recorded since the last call: `%8d:%8lu:%8ld`.
    pub(super) fn print(&mut self, live: &[Arc<Live>], out: &mut impl Write) {
        for (i, l) in live.iter().enumerate() {
            let cycles = l.cycles.load(Ordering::Acquire);
            // Values older than the ring are gone, as in cyclictest.
            self.read[i] = self.read[i].max(cycles.saturating_sub(VALBUF as u64));
            while self.read[i] < cycles {
                let c = self.read[i];
                let v = l.value(c).unwrap_or(0);
                if v > self.red_max[i].1 || self.red_count[i] == 0 {
                    self.red_max[i] = (c, v);
                }
                self.red_count[i] += 1;
                if self.red_count[i] == self.reduce {
                    let (cycle, value) = self.red_max[i];
                    let _ = writeln!(out, "{i:8}:{cycle:8}:{value:8}");
                    self.red_count[i] = 0;
                }
                self.read[i] += 1;
            }
        }
    }
}

impl LiveLines {
    /// The live display of `specs`.
    pub fn new(
        specs: Vec<ThreadSpec>,
        nsecs: bool,
        policy: String,
        refresh_on_max: bool,
        quiet: bool,
        verbose: Option<Verbose>,
    ) -> Self {
        let n = specs.len();
        Self {
            specs,
            nsecs,
            policy,
            refresh_on_max,
            quiet,
            verbose,
            drawn: false,
            maxima: vec![u64::MAX; n],
        }
    }

    /// Draws the lines on standard output; a failed write stops the run (see [`crate::out`]).
    fn draw(&mut self, live: &[Arc<Live>], last: bool) {
        let mut out = Vec::new();
        self.render(live, last, &mut out);
        if !out.is_empty() {
            let mut stdout = std::io::stdout().lock();
            crate::out::check_stdout(stdout.write_all(&out).and_then(|()| stdout.flush()));
        }
    }

    fn render(&mut self, live: &[Arc<Live>], last: bool, out: &mut Vec<u8>) {
        if let Some(v) = &mut self.verbose {
            v.print(live, out);
            return;
        }
        if self.quiet {
            return;
        }
        let maxima: Vec<u64> = live.iter().map(|l| l.max.load(Ordering::Relaxed)).collect();
        if self.refresh_on_max && self.drawn && maxima == self.maxima && !last {
            return;
        }
        self.maxima = maxima;
        if self.drawn {
            let _ = write!(out, "\x1b[{}A", live.len() + 2);
        }
        let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let _ = writeln!(
            out,
            "policy: {}: loadavg: {}          \n",
            self.policy,
            loadavg.trim_end()
        );
        for (i, l) in live.iter().enumerate() {
            let _ = writeln!(out, "{}", l.status_line(i, &self.specs[i], self.nsecs));
        }
        self.drawn = true;
    }
}

impl Watch for LiveLines {
    fn tick(&mut self, live: &[Arc<Live>]) -> bool {
        self.draw(live, false);
        false
    }

    fn done(&mut self, live: &[Arc<Live>]) {
        // 2.4 prints no sample after its main loop's last turn (`-v`): nor do we.
        if self.verbose.is_some() {
            return;
        }
        self.draw(live, true);
    }
}

/// cyclictest's `-F`: a named pipe that every reader gets the status lines from.
#[derive(Debug)]
pub struct Fifo {
    path: std::path::PathBuf,
}

impl Fifo {
    /// Creates the pipe at `path` (replacing a file there, as cyclictest does).
    pub fn create(path: &std::path::Path) -> Result<Self> {
        let _ = std::fs::remove_file(path);
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .with_context(|| format!("-F {}: the path has a NUL byte", path.display()))?;
        // SAFETY: `c` is a NUL-terminated path.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o666) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("-F {}: cannot create the named pipe", path.display()));
        }
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    /// Writes the status lines to a reader, if one has the pipe open.
    pub fn serve(&self, live: &[Arc<Live>], specs: &[ThreadSpec], nsecs: bool) {
        use std::os::unix::fs::OpenOptionsExt;
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.path);
        if let Ok(mut f) = opened {
            for (i, l) in live.iter().enumerate() {
                let _ = writeln!(f, "{}", l.status_line(i, &specs[i], nsecs));
            }
        }
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The live display and the `-F` pipe together, as the main thread runs them.
#[derive(Debug)]
pub struct MainLoop {
    /// The status lines (or `-v` values).
    pub lines: LiveLines,
    /// The `-F` pipe.
    pub fifo: Option<Fifo>,
    /// The progress line on stderr (ours; only with -q and a known duration).
    pub progress: Option<Progress>,
    /// When the last `-F` reader was served.
    served: Option<Instant>,
}

impl MainLoop {
    /// The main thread's work.
    pub fn new(lines: LiveLines, fifo: Option<Fifo>, progress: Option<Progress>) -> Self {
        Self {
            lines,
            fifo,
            progress,
            served: None,
        }
    }
}

impl Watch for MainLoop {
    fn tick(&mut self, live: &[Arc<Live>]) -> bool {
        self.lines.tick(live);
        if let Some(p) = &self.progress {
            p.tick();
        }
        if let Some(f) = &self.fifo {
            // cyclictest's fifo thread looks for a reader every half second.
            if self
                .served
                .is_none_or(|t| t.elapsed() >= Duration::from_millis(500))
            {
                f.serve(live, &self.lines.specs, self.lines.nsecs);
                self.served = Some(Instant::now());
            }
        }
        false
    }

    fn done(&mut self, live: &[Arc<Live>]) {
        if let Some(p) = &self.progress {
            p.finish();
        }
        self.lines.done(live);
    }
}
