//! The monitoring events: one counter file per event per group per domain.

use std::fmt;
use std::str::FromStr;

use super::error::ResctrlError;

/// A monitoring event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// `mbm_total_bytes`: all memory bandwidth.
    MbmTotalBytes,
    /// `mbm_local_bytes`: bandwidth to the local NUMA node.
    MbmLocalBytes,
    /// `llc_occupancy`: bytes of L3 held (a level, not a running count: it neither wraps nor
    /// grows monotonically).
    LlcOccupancy,
}

impl Event {
    /// Every event, in file order.
    pub const ALL: [Event; 3] = [
        Event::MbmTotalBytes,
        Event::MbmLocalBytes,
        Event::LlcOccupancy,
    ];

    /// The event's file name.
    pub fn name(self) -> &'static str {
        match self {
            Event::MbmTotalBytes => "mbm_total_bytes",
            Event::MbmLocalBytes => "mbm_local_bytes",
            Event::LlcOccupancy => "llc_occupancy",
        }
    }

    /// Whether it is a bandwidth counter (which wraps and has a rate).
    pub fn is_mbm(self) -> bool {
        !matches!(self, Event::LlcOccupancy)
    }

    pub(super) fn idx(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Event {
    type Err = ResctrlError;

    fn from_str(s: &str) -> Result<Self, ResctrlError> {
        Event::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| ResctrlError::UnknownEvent {
                input: s.to_string(),
            })
    }
}
