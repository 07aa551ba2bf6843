//! Sets of CPU numbers, written and read in the kernel's list syntax (`0,2-5`).
//!
//! The syntax is the one `/sys/devices/system/cpu/online`, `taskset -c`, `isolcpus=` and
//! rt-tests' `-a`/`-c` use: comma-separated CPU numbers or inclusive ranges `a-b`. Empty
//! strings (an empty sysfs file) are the empty set. CPU numbers stop at [`CpuSet::MAX_CPU`],
//! the last CPU a glibc `cpu_set_t` can name.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// A set of CPU numbers, kept sorted.
///
/// ```
/// use qpw_core::CpuSet;
///
/// let set: CpuSet = "0,2-4".parse()?;
/// assert_eq!(set.iter().collect::<Vec<_>>(), [0, 2, 3, 4]);
/// assert_eq!(set.to_string(), "0,2-4");
/// assert!("5-2".parse::<CpuSet>().is_err());
/// # Ok::<(), qpw_core::Error>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet {
    cpus: Vec<usize>,
}

impl CpuSet {
    /// The largest CPU number accepted: `CPU_SETSIZE - 1` in glibc.
    pub const MAX_CPU: usize = libc::CPU_SETSIZE as usize - 1;

    /// The empty set.
    pub const fn new() -> Self {
        Self { cpus: Vec::new() }
    }

    /// Parses a list such as `0,2-5`; the error names the list and what is wrong with it.
    pub fn parse(input: &str) -> Result<Self> {
        input.parse()
    }

    /// The set `0..n`.
    pub fn first_n(n: usize) -> Self {
        Self {
            cpus: (0..n).collect(),
        }
    }

    /// Builds a set from CPU numbers, checking each against [`CpuSet::MAX_CPU`].
    pub fn from_cpus(cpus: impl IntoIterator<Item = usize>) -> Result<Self> {
        let mut set = Self::new();
        for cpu in cpus {
            if cpu > Self::MAX_CPU {
                return Err(Error::CpuOutOfRange {
                    cpu,
                    max: Self::MAX_CPU,
                });
            }
            set.insert(cpu);
        }
        Ok(set)
    }

    /// Adds `cpu`; returns whether it was new.
    pub fn insert(&mut self, cpu: usize) -> bool {
        match self.cpus.binary_search(&cpu) {
            Ok(_) => false,
            Err(at) => {
                self.cpus.insert(at, cpu);
                true
            }
        }
    }

    /// Whether `cpu` is in the set.
    #[inline]
    pub fn contains(&self, cpu: usize) -> bool {
        self.cpus.binary_search(&cpu).is_ok()
    }

    /// The number of CPUs in the set.
    #[inline]
    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    /// Whether the set is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }

    /// The lowest CPU.
    pub fn first(&self) -> Option<usize> {
        self.cpus.first().copied()
    }

    /// The highest CPU.
    pub fn last(&self) -> Option<usize> {
        self.cpus.last().copied()
    }

    /// The CPUs in ascending order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = usize> + ExactSizeIterator + '_ {
        self.cpus.iter().copied()
    }

    /// The CPUs as a sorted slice.
    pub fn as_slice(&self) -> &[usize] {
        &self.cpus
    }

    /// The CPUs in both sets.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        Self {
            cpus: self.iter().filter(|&c| other.contains(c)).collect(),
        }
    }

    /// The CPUs in `self` but not in `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        Self {
            cpus: self.iter().filter(|&c| !other.contains(c)).collect(),
        }
    }

    /// The CPUs in either set.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        let mut out = self.clone();
        for cpu in other.iter() {
            out.insert(cpu);
        }
        out
    }

    /// Whether every CPU of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.iter().all(|c| other.contains(c))
    }
}

impl FromIterator<usize> for CpuSet {
    /// Collects CPU numbers; numbers past [`CpuSet::MAX_CPU`] are the caller's bug here, so use
    /// [`CpuSet::from_cpus`] for numbers that come from outside.
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let mut cpus: Vec<usize> = iter.into_iter().collect();
        cpus.sort_unstable();
        cpus.dedup();
        Self { cpus }
    }
}

impl FromStr for CpuSet {
    type Err = Error;

    fn from_str(input: &str) -> Result<Self> {
        let syntax = |reason: String| Error::CpuListSyntax {
            input: input.to_string(),
            reason,
        };
        let number = |text: &str| -> Result<usize> {
            if text.is_empty() {
                return Err(syntax("a range is missing a number".to_string()));
            }
            if !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(syntax(format!("`{text}` is not a CPU number")));
            }
            // Digits only, so the only failure left is overflow: out of range either way.
            let cpu = text.parse::<usize>().unwrap_or(usize::MAX);
            if cpu > CpuSet::MAX_CPU {
                return Err(Error::CpuOutOfRange {
                    cpu,
                    max: CpuSet::MAX_CPU,
                });
            }
            Ok(cpu)
        };

        let mut set = CpuSet::new();
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Ok(set);
        }
        for item in trimmed.split(',') {
            let item = item.trim();
            if item.is_empty() {
                return Err(syntax("empty item between commas".to_string()));
            }
            match item.split_once('-') {
                None => {
                    set.insert(number(item)?);
                }
                Some((lo, hi)) => {
                    let (lo, hi) = (number(lo.trim())?, number(hi.trim())?);
                    if lo > hi {
                        return Err(syntax(format!("range `{item}` runs backwards")));
                    }
                    for cpu in lo..=hi {
                        set.insert(cpu);
                    }
                }
            }
        }
        Ok(set)
    }
}

impl fmt::Display for CpuSet {
    /// Writes the set in list syntax with ranges folded: `0,2-5`. The empty set is written
    /// `(none)`, so that it reads well in messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cpus.is_empty() {
            return f.write_str("(none)");
        }
        let mut first = true;
        let mut i = 0;
        while i < self.cpus.len() {
            let start = self.cpus[i];
            let mut end = start;
            while i + 1 < self.cpus.len() && self.cpus[i + 1] == end + 1 {
                i += 1;
                end = self.cpus[i];
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_ranges() {
        let set: CpuSet = "3,0-1, 5 ,6-7".parse().unwrap();
        assert_eq!(set.as_slice(), &[0, 1, 3, 5, 6, 7]);
        assert_eq!(set.to_string(), "0-1,3,5-7");
        assert_eq!("".parse::<CpuSet>().unwrap().len(), 0);
        assert_eq!("\n".parse::<CpuSet>().unwrap().len(), 0);
        assert_eq!(CpuSet::new().to_string(), "(none)");
    }

    #[test]
    fn rejects_bad_lists_naming_the_input() {
        for (input, needle) in [
            ("0-", "`0-`"),
            ("5-2", "runs backwards"),
            ("x", "`x` is not a CPU number"),
            ("1,,2", "empty item"),
            ("-3", "missing a number"),
        ] {
            let err = input.parse::<CpuSet>().unwrap_err().to_string();
            assert!(err.contains(needle), "{input}: {err}");
            assert!(err.contains(&format!("`{input}`")), "{input}: {err}");
        }
        let err = "4096".parse::<CpuSet>().unwrap_err().to_string();
        assert_eq!(
            err,
            "cpu 4096 is out of range: CPU numbers go from 0 to 1023"
        );
        let err = "99999999999999999999999".parse::<CpuSet>().unwrap_err();
        assert!(matches!(err, Error::CpuOutOfRange { .. }));
    }

    #[test]
    fn set_algebra() {
        let a = CpuSet::parse("0-3").unwrap();
        let b = CpuSet::parse("2-5").unwrap();
        assert_eq!(a.intersection(&b).to_string(), "2-3");
        assert_eq!(a.difference(&b).to_string(), "0-1");
        assert_eq!(a.union(&b).to_string(), "0-5");
        assert!(CpuSet::parse("1-2").unwrap().is_subset(&a));
        assert!(!b.is_subset(&a));
    }
}
