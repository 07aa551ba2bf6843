//! The switch: which of the four read paths a counter file read takes.

use std::fmt;
use std::str::FromStr;

use super::error::ResctrlError;

/// How a counter file read reaches the counter's domain: the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReadPath {
    /// `smp_call_on_cpu`: a worker hop to the domain's housekeeping CPU, always.
    #[default]
    Workqueue,
    /// `smp_call_function_single`: the reader's CPU if in the domain, else a signal to the
    /// thread running on a domain CPU, whose handler reads while the reader spins.
    Interrupt,
    /// Direct when the reader is bound in the domain, else the workqueue.
    Local,
    /// The overflow worker's latest value and rate; no cross-CPU work.
    Cached,
}

impl ReadPath {
    /// Every path, in the order the figures report them.
    pub const ALL: [ReadPath; 4] = [
        ReadPath::Workqueue,
        ReadPath::Interrupt,
        ReadPath::Local,
        ReadPath::Cached,
    ];

    /// The path's name as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            ReadPath::Workqueue => "workqueue",
            ReadPath::Interrupt => "interrupt",
            ReadPath::Local => "local",
            ReadPath::Cached => "cached",
        }
    }

    pub(super) fn idx(self) -> usize {
        self as usize
    }
}

impl fmt::Display for ReadPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReadPath {
    type Err = ResctrlError;

    fn from_str(s: &str) -> Result<Self, ResctrlError> {
        ReadPath::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| ResctrlError::UnknownPath {
                input: s.to_string(),
            })
    }
}
