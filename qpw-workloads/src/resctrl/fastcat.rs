//! A fastcat-style reader (seed 000).

use std::time::{Duration, Instant};

use super::error::ResctrlError;
use super::file::MonFile;
use super::model::Resctrl;
use super::stats::ThreadUsage;
use super::value::MonRead;

/// A fastcat-style reader (seed 000): opens a set of files once, then reads them all, pass
/// after pass; the setup is timed apart from the reads.
#[derive(Debug)]
pub struct Fastcat<'a> {
    resctrl: &'a Resctrl,
    files: Vec<MonFile>,
    setup: Duration,
}

/// One pass of a [`Fastcat`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Wall time of the pass.
    pub elapsed: Duration,
    /// Files read.
    pub files: usize,
    /// Results that were not values.
    pub non_values: usize,
    /// The reader's voluntary context switches during the pass (`ru_nvcsw`, read before and
    /// after the pass, not around each read: see [`HoldStats`](super::HoldStats)). A reader
    /// sleeps only while it waits for a worker or an interrupted thread, inside
    /// `rdtgroup_mutex`, or, rarely, for the mutex itself.
    pub voluntary_switches: u64,
    /// Time the reader was off the CPU during the pass: wall time minus its CPU time.
    pub off_cpu: Duration,
}

impl<'a> Fastcat<'a> {
    /// Opens `paths` (the setup: `FASTCAT_READ_COUNT=0`).
    pub fn open<S: AsRef<str>>(resctrl: &'a Resctrl, paths: &[S]) -> Result<Self, ResctrlError> {
        let start = Instant::now();
        let files = paths
            .iter()
            .map(|p| resctrl.open(p.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            resctrl,
            files,
            setup: start.elapsed(),
        })
    }

    /// How long opening the files took.
    pub fn setup(&self) -> Duration {
        self.setup
    }

    /// The open files.
    pub fn files(&self) -> &[MonFile] {
        &self.files
    }

    /// Reads every file once (the `pread` loop), by the current read path.
    pub fn pass(&self) -> Result<Pass, ResctrlError> {
        self.pass_with(|_, _| {})
    }

    /// Like [`pass`](Self::pass), handing each result to `seen`.
    pub fn pass_with(
        &self,
        mut seen: impl FnMut(&MonFile, &MonRead),
    ) -> Result<Pass, ResctrlError> {
        let before = ThreadUsage::now();
        let start = Instant::now();
        let mut non_values = 0;
        for file in &self.files {
            let read = self.resctrl.read(file)?;
            if read.value.value().is_none() {
                non_values += 1;
            }
            seen(file, &read);
        }
        let elapsed = start.elapsed();
        let (voluntary_switches, off_cpu) = ThreadUsage::now().since(&before);
        Ok(Pass {
            elapsed,
            files: self.files.len(),
            non_values,
            voluntary_switches,
            off_cpu,
        })
    }
}
