//! How each CPU's remote work is done: queued to the CPU's worker, or run by the caller under
//! the CPU's lock (an atomic lock word, or a restartable sequence that the caller fences).

use std::fmt;
use std::str::FromStr;

use crate::{CpuSet, Error, Result};

/// The mode of one CPU, the kernel's `pwlocks=` switch taken per CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Kernel mode 0: `queue_on` posts the work to the CPU's worker thread, pinned there;
    /// `flush` waits for it. Only that CPU's threads take its lock.
    Queue,
    /// Kernel mode 1: `queue_on` runs the work at once in the caller, under the CPU's lock;
    /// `flush` has nothing to wait for.
    Remote,
    /// Remote mode with an owner path that has no atomic read-modify-write: the CPU's lock in
    /// [`Qpw::per_cpu`](crate::Qpw::per_cpu) state is a [`FencedLock`](crate::FencedLock),
    /// which the CPU's own threads take with a restartable sequence and another CPU takes by
    /// raising a flag and fencing the CPU with `membarrier` (no worker, no context switch; an
    /// interrupt on the CPU while one of the process's threads runs there, about 15 us on our
    /// 2-vCPU VM, `docs/validation.md`). Work runs in
    /// the caller, as in [`Mode::Remote`]. No kernel counterpart: the kernel's owner path is
    /// `preempt_disable()`, which userspace lacks. Where restartable sequences or the rseq
    /// fence are missing, the lock uses the atomic protocol of remote mode
    /// ([`rseq::status`](crate::rseq::status) and [`Qpw::describe`](crate::Qpw::describe) say
    /// so).
    Fenced,
}

impl Mode {
    /// The mode's name as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Queue => "queue",
            Mode::Remote => "remote",
            Mode::Fenced => "fenced",
        }
    }

    /// Whether work for the CPU runs in the caller under the CPU's lock, which any thread may
    /// take: remote and fenced mode (the kernel's `pwlocks=1`), not queue mode.
    ///
    /// ```
    /// use qpw_core::Mode;
    ///
    /// assert!(Mode::Remote.is_remote() && Mode::Fenced.is_remote());
    /// assert!(!Mode::Queue.is_remote());
    /// ```
    pub fn is_remote(self) -> bool {
        !matches!(self, Mode::Queue)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an instance chooses each CPU's [`Mode`]. Fixed when the instance is built.
///
/// The default, [`Policy::Auto`], is the kernel's rule for `pwlocks=` (FIDELITY item 5): with
/// no `pwlocks=` on the command line, isolation (`isolcpus=`, `nohz_full=`) turns mode 1 on.
/// Here the choice is per CPU: remote mode on the isolated and `nohz_full` CPUs, queue mode on
/// the others, and queue mode everywhere when there are none. Any other policy is an explicit
/// choice, which always wins, as an explicit `pwlocks=0/1` does.
///
/// Parsed from `auto`, `queue`, `remote`, `fenced`, `isolated`, `remote:<cpu-list>` or
/// `fenced:<cpu-list>`:
///
/// ```
/// use qpw_core::Policy;
///
/// assert_eq!(Policy::default(), Policy::Auto);
/// assert_eq!("auto".parse::<Policy>()?, Policy::Auto);
/// assert_eq!("isolated".parse::<Policy>()?, Policy::Isolated);
/// assert_eq!("remote:1,3".parse::<Policy>()?, Policy::RemoteOn("1,3".parse()?));
/// assert_eq!("fenced:2-3".parse::<Policy>()?, Policy::FencedOn("2-3".parse()?));
/// assert!("fast".parse::<Policy>().is_err());
/// # Ok::<(), qpw_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Policy {
    /// The default, the kernel's rule: remote mode on the isolated and `nohz_full` CPUs, queue
    /// mode on the others (so queue mode everywhere on a machine without isolation). The same
    /// modes as [`Policy::Isolated`]; reports say the rule chose them, not the user.
    #[default]
    Auto,
    /// Every CPU in queue mode (`pwlocks=0`).
    Queue,
    /// Every CPU in remote mode (`pwlocks=1`).
    Remote,
    /// Remote mode on isolated and `nohz_full` CPUs, queue mode on the others: only the CPUs that
    /// must not be disturbed pay for remote-capable locking. The rule of [`Policy::Auto`],
    /// chosen explicitly.
    Isolated,
    /// Remote mode on the listed CPUs, queue mode on the rest. Every listed CPU must be
    /// managed by the instance ([`Error::PolicyCpuNotManaged`] otherwise).
    RemoteOn(CpuSet),
    /// Every CPU in [fenced mode](Mode::Fenced).
    Fenced,
    /// Fenced mode on the listed CPUs, queue mode on the rest (the listed CPUs must be
    /// managed, as for [`Policy::RemoteOn`]).
    FencedOn(CpuSet),
}

impl Policy {
    /// The mode of `cpu` under this policy, given the isolated CPUs.
    pub fn mode_of(&self, cpu: usize, isolated: &CpuSet) -> Mode {
        let chosen = match self {
            Policy::Queue => false,
            Policy::Remote | Policy::Fenced => true,
            Policy::Auto | Policy::Isolated => isolated.contains(cpu),
            Policy::RemoteOn(set) | Policy::FencedOn(set) => set.contains(cpu),
        };
        match (chosen, self) {
            (false, _) => Mode::Queue,
            (true, Policy::Fenced | Policy::FencedOn(_)) => Mode::Fenced,
            (true, _) => Mode::Remote,
        }
    }

    /// The CPUs the policy lists by number, which the instance must manage.
    pub fn listed(&self) -> Option<&CpuSet> {
        match self {
            Policy::RemoteOn(set) | Policy::FencedOn(set) => Some(set),
            _ => None,
        }
    }

    /// Whether the modes follow the machine's isolation, so that the topology is read.
    pub fn follows_isolation(&self) -> bool {
        matches!(self, Policy::Auto | Policy::Isolated)
    }

    /// Whether the policy was chosen by the user rather than left to the default rule.
    pub fn is_explicit(&self) -> bool {
        !matches!(self, Policy::Auto)
    }

    /// Why a CPU has `mode` under this policy, for reports; `any_remote` says whether the
    /// instance has a remote- or fenced-mode CPU at all.
    pub fn reason(&self, mode: Mode, any_remote: bool) -> &'static str {
        match (self, mode) {
            (Policy::Auto | Policy::Isolated, Mode::Queue) if !any_remote => {
                "no isolated or nohz_full CPU"
            }
            (Policy::Auto | Policy::Isolated, Mode::Queue) => "housekeeping",
            (Policy::Auto | Policy::Isolated, _) => "isolated or nohz_full",
            (Policy::Queue | Policy::Remote | Policy::Fenced, _) => "every CPU",
            (Policy::RemoteOn(_) | Policy::FencedOn(_), Mode::Queue) => "not listed",
            (Policy::RemoteOn(_) | Policy::FencedOn(_), _) => "listed",
        }
    }
}

impl FromStr for Policy {
    type Err = Error;

    fn from_str(input: &str) -> Result<Self> {
        match input.trim() {
            "auto" => Ok(Policy::Auto),
            "queue" => Ok(Policy::Queue),
            "remote" => Ok(Policy::Remote),
            "isolated" => Ok(Policy::Isolated),
            "fenced" => Ok(Policy::Fenced),
            other => {
                if let Some(list) = other.strip_prefix("remote:") {
                    Ok(Policy::RemoteOn(list.parse()?))
                } else if let Some(list) = other.strip_prefix("fenced:") {
                    Ok(Policy::FencedOn(list.parse()?))
                } else {
                    Err(Error::UnknownMode {
                        input: input.to_string(),
                    })
                }
            }
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Auto => f.write_str("auto"),
            Policy::Queue => f.write_str("queue"),
            Policy::Remote => f.write_str("remote"),
            Policy::Isolated => f.write_str("isolated"),
            Policy::RemoteOn(set) => write!(f, "remote:{set}"),
            Policy::Fenced => f.write_str("fenced"),
            Policy::FencedOn(set) => write!(f, "fenced:{set}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trips() {
        for text in [
            "auto",
            "queue",
            "remote",
            "isolated",
            "remote:1,3-5",
            "fenced",
            "fenced:0,2",
        ] {
            assert_eq!(text.parse::<Policy>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn unknown_names_are_named() {
        let err = "rmeote".parse::<Policy>().unwrap_err().to_string();
        assert!(err.starts_with("unknown mode `rmeote`"), "{err}");
        let err = "remote:0-".parse::<Policy>().unwrap_err().to_string();
        assert!(err.contains("`0-`"), "{err}");
    }

    #[test]
    fn isolated_policy_follows_the_isolated_set() {
        let iso: CpuSet = "3".parse().unwrap();
        for rule in [Policy::Auto, Policy::Isolated] {
            assert_eq!(rule.mode_of(3, &iso), Mode::Remote);
            assert_eq!(rule.mode_of(2, &iso), Mode::Queue);
            assert_eq!(rule.mode_of(3, &CpuSet::new()), Mode::Queue);
        }
        assert_eq!(Policy::Queue.mode_of(3, &iso), Mode::Queue);
        assert_eq!(Policy::Remote.mode_of(2, &iso), Mode::Remote);
    }

    #[test]
    fn fenced_policies_choose_fenced_mode() {
        let none = CpuSet::new();
        assert_eq!(Policy::Fenced.mode_of(0, &none), Mode::Fenced);
        let listed = Policy::FencedOn("1".parse().unwrap());
        assert_eq!(listed.mode_of(1, &none), Mode::Fenced);
        assert_eq!(listed.mode_of(0, &none), Mode::Queue);
        assert_eq!(listed.reason(Mode::Fenced, true), "listed");
        assert_eq!(listed.reason(Mode::Queue, true), "not listed");
        assert!(!listed.follows_isolation());
    }
}
