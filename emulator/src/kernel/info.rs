//! The running kernel's own per-CPU-work mode: whether it carries the PW/QPW patches
//! (`CONFIG_PWLOCKS`, v4 2026; `CONFIG_QPW`, the 2024 RFC), which mode they are in
//! (`pwlocks=` / `qpw=` on the command line; without it, mode 1 when isolation is configured),
//! the isolated and `nohz_full` CPUs, and RT throttling, which decides how long a `SCHED_FIFO`
//! spinner can starve a kworker (`sched_rt_runtime_us` of each `sched_rt_period_us`).

use std::io::Read;

use qpw_core::{CpuSet, Topology};

/// What the kernel says about itself.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct KernelInfo {
    /// `uname -r`.
    pub release: String,
    /// Whether the PW/QPW patches are built in: `yes (CONFIG_PWLOCKS=y in /proc/config.gz)`,
    /// `no (...)`, or `unknown (...)` when no kernel configuration could be read.
    pub pw_patches: String,
    /// The mode of the kernel's per-CPU drains: `0` (queue_work_on on the target CPU, as
    /// mainline), `1` (run remotely under the target's lock), with the reason.
    pub mode: String,
    /// `pwlocks=` or `qpw=` as given on the kernel command line.
    pub cmdline_switch: Option<String>,
    /// Isolated CPUs (`/sys/devices/system/cpu/isolated`).
    pub isolated: String,
    /// `nohz_full` CPUs.
    pub nohz_full: String,
    /// `/proc/sys/kernel/sched_rt_runtime_us` (-1: no throttling).
    pub rt_runtime_us: Option<i64>,
    /// `/proc/sys/kernel/sched_rt_period_us`.
    pub rt_period_us: Option<i64>,
}

impl KernelInfo {
    /// Reads the running kernel's.
    pub fn read() -> Self {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
        let (config, source) = read_config(&release);
        let topo = Topology::read().ok();
        let set = |f: fn(&Topology) -> CpuSet| topo.as_ref().map(f).unwrap_or_default();
        let isolated = set(|t| t.isolated().clone());
        let nohz_full = set(|t| t.nohz_full().clone());
        let int = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|s| s.trim().parse().ok())
        };
        let switch = cmdline_switch(&cmdline);
        let patched = config.as_deref().map(patches_in_config);
        let (pw_patches, mode) = judge(
            patched,
            &source,
            switch.as_deref(),
            !isolated.is_empty() || !nohz_full.is_empty(),
        );
        Self {
            release,
            pw_patches,
            mode,
            cmdline_switch: switch,
            isolated: isolated.to_string(),
            nohz_full: nohz_full.to_string(),
            rt_runtime_us: int("/proc/sys/kernel/sched_rt_runtime_us"),
            rt_period_us: int("/proc/sys/kernel/sched_rt_period_us"),
        }
    }

    /// One line per fact, for the text output.
    pub fn lines(&self) -> Vec<String> {
        let throttling = match (self.rt_runtime_us, self.rt_period_us) {
            (Some(-1), _) => "off (sched_rt_runtime_us = -1)".to_string(),
            (Some(r), Some(p)) => format!(
                "on: SCHED_FIFO/RR tasks get {r} us of each {p} us (a spinner lets a kworker \
                 in after {:.2} s)",
                r as f64 / 1e6
            ),
            _ => "unknown".to_string(),
        };
        vec![
            format!("Kernel:           {}", self.release),
            format!("PW/QPW patches:   {}", self.pw_patches),
            format!("Per-CPU drains:   mode {}", self.mode),
            format!(
                "Isolated CPUs:    {} (nohz_full: {})",
                self.isolated, self.nohz_full
            ),
            format!("RT throttling:    {throttling}"),
        ]
    }
}

/// The kernel's configuration text and where it came from.
fn read_config(release: &str) -> (Option<String>, String) {
    if let Ok(f) = std::fs::File::open("/proc/config.gz") {
        let mut text = String::new();
        if flate2::read::GzDecoder::new(f)
            .read_to_string(&mut text)
            .is_ok()
        {
            return (Some(text), "/proc/config.gz".to_string());
        }
    }
    let boot = format!("/boot/config-{release}");
    match std::fs::read_to_string(&boot) {
        Ok(text) => (Some(text), boot),
        Err(_) => (None, format!("neither /proc/config.gz nor {boot}")),
    }
}

/// Whether a kernel configuration has the patches: `Some(option)` naming the one set.
pub fn patches_in_config(config: &str) -> Option<&'static str> {
    ["CONFIG_PWLOCKS", "CONFIG_QPW"]
        .into_iter()
        .find(|opt| config.lines().any(|l| l.trim() == format!("{opt}=y")))
}

/// `pwlocks=N` or `qpw=N` from the kernel command line.
pub fn cmdline_switch(cmdline: &str) -> Option<String> {
    cmdline
        .split_whitespace()
        .find(|w| w.starts_with("pwlocks=") || w.starts_with("qpw="))
        .map(str::to_string)
}

/// The verdict: (patches, mode), each with its reason. `patched` is `None` when no
/// configuration was found, `Some(None)` when it lacks both options.
pub fn judge(
    patched: Option<Option<&str>>,
    source: &str,
    switch: Option<&str>,
    isolation: bool,
) -> (String, String) {
    let patches = match patched {
        Some(Some(opt)) => format!("yes ({opt}=y in {source})"),
        Some(None) => format!("no (neither CONFIG_PWLOCKS nor CONFIG_QPW in {source})"),
        None => format!("unknown (no kernel configuration: {source})"),
    };
    let explicit = switch.and_then(|s| s.split_once('=')).map(|(_, v)| v);
    let mode = match (patched, explicit) {
        (Some(None), _) => "0 (mainline: queue_work_on to the target CPU's kworker)".to_string(),
        (_, Some(v @ ("0" | "1"))) => format!(
            "{v} (explicit {} on the command line)",
            switch.unwrap_or_default()
        ),
        (Some(Some(_)), _) if isolation => {
            "1 (auto: isolation is configured and no pwlocks= is given)".to_string()
        }
        (Some(Some(_)), _) => "0 (no isolation and no pwlocks= given)".to_string(),
        (None, _) => "unknown (0 unless the kernel carries the PW/QPW patches)".to_string(),
    };
    (patches, mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_follows_the_kernel_rule() {
        let src = "/proc/config.gz";
        let (p, m) = judge(Some(None), src, None, true);
        assert!(
            p.starts_with("no") && m.starts_with("0 (mainline"),
            "{p} / {m}"
        );
        let (p, m) = judge(Some(Some("CONFIG_PWLOCKS")), src, None, true);
        assert!(
            p.starts_with("yes") && m.starts_with("1 (auto"),
            "{p} / {m}"
        );
        let (_, m) = judge(Some(Some("CONFIG_PWLOCKS")), src, Some("pwlocks=0"), true);
        assert!(m.starts_with("0 (explicit pwlocks=0"), "{m}");
        let (_, m) = judge(Some(Some("CONFIG_QPW")), src, Some("qpw=1"), false);
        assert!(m.starts_with("1 (explicit qpw=1"), "{m}");
        let (_, m) = judge(Some(Some("CONFIG_PWLOCKS")), src, None, false);
        assert!(m.starts_with("0 (no isolation"), "{m}");
        let (p, m) = judge(None, "neither", None, false);
        assert!(
            p.starts_with("unknown") && m.starts_with("unknown"),
            "{p} / {m}"
        );
    }

    #[test]
    fn config_and_cmdline_are_read() {
        assert_eq!(patches_in_config("# x\nCONFIG_QPW=y\n"), Some("CONFIG_QPW"));
        assert_eq!(patches_in_config("# CONFIG_PWLOCKS is not set\n"), None);
        assert_eq!(
            cmdline_switch("quiet pwlocks=1 nohz_full=3"),
            Some("pwlocks=1".into())
        );
        assert_eq!(cmdline_switch("quiet"), None);
    }
}
