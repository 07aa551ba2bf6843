//! What a read returns: the value as the kernel prints it, and who executed the read.

use std::fmt;
use std::time::Duration;

/// What a counter file shows, as the kernel prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadValue {
    /// Bytes.
    Value(u64),
    /// `Error`: the read failed (here: it ran outside the counter's domain, or the RMID is bad).
    Error,
    /// `Unavailable`: the hardware has no data (the U bit of `QM_CTR`).
    Unavailable,
    /// `Unassigned`: no hardware counter is assigned to this event (`mbm_event` mode).
    Unassigned,
}

impl ReadValue {
    /// The value, if there is one.
    pub fn value(self) -> Option<u64> {
        match self {
            ReadValue::Value(v) => Some(v),
            _ => None,
        }
    }

    pub(super) fn encode(self) -> (u64, u64) {
        match self {
            ReadValue::Value(v) => (0, v),
            ReadValue::Error => (1, 0),
            ReadValue::Unavailable => (2, 0),
            ReadValue::Unassigned => (3, 0),
        }
    }

    pub(super) fn decode(status: u64, value: u64) -> Self {
        match status {
            0 => ReadValue::Value(value),
            2 => ReadValue::Unavailable,
            3 => ReadValue::Unassigned,
            _ => ReadValue::Error,
        }
    }
}

impl fmt::Display for ReadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadValue::Value(v) => write!(f, "{v}"),
            ReadValue::Error => f.write_str("Error"),
            ReadValue::Unavailable => f.write_str("Unavailable"),
            ReadValue::Unassigned => f.write_str("Unassigned"),
        }
    }
}

/// Who executed a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Executor {
    /// The reader itself, on `cpu` (local path, or the interrupt path's own-CPU case).
    Reader {
        /// The reader's CPU.
        cpu: usize,
    },
    /// The worker of `cpu` (workqueue path, or the local path's fallback).
    Worker {
        /// The worker's CPU.
        cpu: usize,
    },
    /// The handler of the thread running on `cpu`, interrupted by a signal.
    Interrupt {
        /// The CPU the interrupted thread is registered for.
        cpu: usize,
        /// The physical CPU the handler ran on, if known.
        phys_cpu: Option<usize>,
    },
    /// The overflow worker's cache: nothing ran for this read.
    Cache,
}

/// One file read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MonRead {
    /// What the file shows.
    pub value: ReadValue,
    /// Who read the counter.
    pub executor: Executor,
    /// The rate (bytes/s) over the last overflow period, for cached MBM reads.
    pub rate: Option<u64>,
    /// How old a cached value is.
    pub age: Option<Duration>,
    /// How long the reader waited, holding `rdtgroup_mutex`, for the worker or the
    /// interrupted thread that executed the read (`None`: no other thread executed it).
    pub waited: Option<Duration>,
}
