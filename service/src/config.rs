//! What a service run is asked to do, and the reading of its options: the mode policy by
//! name, how the scrape reaches the CPUs, how the serving threads wait for requests, and
//! durations as the project's tools write them.

use std::time::Duration;

use anyhow::{bail, Result};
use qpw_core::Policy;
use serde::Serialize;

/// How the metrics thread reaches the serving CPUs' state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Scrape {
    /// Per-CPU work ([`Qpw::collector`](qpw_core::Qpw::collector)): queued to the CPU's
    /// worker in queue mode, run in the metrics thread in remote and fenced mode.
    Work,
    /// [`PerCpu::take_each`](qpw_core::PerCpu::take_each): the metrics thread takes each
    /// CPU's lock itself, in every mode.
    Walk,
    /// The counts and service times kept per concurrency id instead ([`qpw_core::PerCid`]:
    /// rseq's `mm_cid`, one slot per thread that runs at once), and the metrics thread walks
    /// the ids used ([`qpw_core::PerCid::take_each`]) from its own CPU, in every mode; the
    /// reply buffers stay per CPU. The metrics' `cpu` label is then the id.
    Cid,
}

impl std::str::FromStr for Scrape {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "work" => Ok(Self::Work),
            "walk" => Ok(Self::Walk),
            "cid" => Ok(Self::Cid),
            _ => Err(format!("--scrape {s}: must be `work`, `walk` or `cid`")),
        }
    }
}

/// How a serving thread waits for its next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Poll {
    /// It spins on a non-blocking socket, as a latency-sensitive service on a dedicated CPU
    /// does: the CPU is never idle, so anything else that runs there preempts it.
    Busy,
    /// It sleeps in `recv` between requests: other work on the CPU runs while it sleeps.
    Block,
}

impl std::str::FromStr for Poll {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "busy" => Ok(Self::Busy),
            "block" => Ok(Self::Block),
            _ => Err(format!("--poll {s}: must be `busy` or `block`")),
        }
    }
}

/// The modes a comparison runs, by name: queue, remote, fenced, and `auto` (the default
/// policy: remote on isolated CPUs, queue elsewhere).
pub fn policy(name: &str) -> Result<Policy> {
    match name {
        "queue" => Ok(Policy::Queue),
        "remote" => Ok(Policy::Remote),
        "fenced" => Ok(Policy::Fenced),
        "auto" | "default" => Ok(Policy::Auto),
        _ => bail!("mode {name:?}: must be queue, remote, fenced or auto"),
    }
}

/// What a service run is asked to do.
#[derive(Debug, Clone)]
pub struct Config {
    /// The mode policy.
    pub policy: Policy,
    /// Scrapes per second (0: none until the end).
    pub scrape_rate: f64,
    /// How the scrape reaches the CPUs.
    pub scrape: Scrape,
    /// How the serving threads wait for requests.
    pub poll: Poll,
    /// Serve the metrics over HTTP on this loopback port (0: any free port); `None`: no
    /// endpoint.
    pub http_port: Option<u16>,
}

/// A duration as the project's tools write them: `2s`, `500ms`, `1m`, or plain seconds.
pub fn duration(name: &str, text: &str) -> Result<Duration> {
    let t = text.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let scale = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        _ => f64::NAN,
    };
    match num.parse::<f64>() {
        Ok(v) if scale.is_finite() && v * scale >= 0.01 && v * scale <= 3600.0 => {
            Ok(Duration::from_secs_f64(v * scale))
        }
        _ => bail!(
            "{name} {text}: must be a duration of 10ms to 1h, written like 2, 2s, 500ms or 1m"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_modes_are_checked() {
        assert_eq!(duration("-D", "2s").unwrap(), Duration::from_secs(2));
        assert_eq!(duration("-D", "500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(duration("-D", "3").unwrap(), Duration::from_secs(3));
        for bad in ["", "x", "2h", "0", "-1s", "5000s"] {
            let e = duration("--duration", bad).unwrap_err().to_string();
            assert!(
                e.starts_with("--duration") && e.contains("10ms to 1h"),
                "{e}"
            );
        }
        assert!(policy("queue").is_ok() && policy("auto").is_ok());
        assert!(policy("fast")
            .unwrap_err()
            .to_string()
            .contains("queue, remote, fenced or auto"));
        assert_eq!("walk".parse::<Scrape>(), Ok(Scrape::Walk));
        assert_eq!("cid".parse::<Scrape>(), Ok(Scrape::Cid));
        assert!("both".parse::<Scrape>().is_err());
    }
}
