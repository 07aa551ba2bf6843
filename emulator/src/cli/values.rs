//! The values the flags take, parsed as rt-tests reads them: ranges, sizes, durations, the
//! run's length, the busy-loop workloads.

use std::time::Duration;

use clap::ArgAction;

/// A cyclictest run length: a duration, or until Ctrl-C (`-D 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLength {
    /// Stop after this long.
    For(Duration),
    /// Run until Ctrl-C (or -l, -b).
    UntilStopped,
}

/// A value parser for an integer in `lo..=hi`, whose error names the legal range.
pub fn int_range(lo: u64, hi: u64) -> impl Fn(&str) -> Result<u64, String> + Clone {
    move |raw: &str| match raw.trim().parse::<u64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(format!("must be an integer in {lo}-{hi}")),
    }
}

/// A value parser for cyclictest's `-h`/`-H`: 1-1000000, as its help says; larger values (up
/// to 2^32 - 1, what 2.4 reads) are taken and cut to 1000000 by the command, as 2.4 cuts them.
pub fn hist_size(raw: &str) -> Result<u64, String> {
    match raw.trim().parse::<u64>() {
        Ok(v) if (1..=u64::from(u32::MAX)).contains(&v) => Ok(v),
        _ => Err(
            "must be an integer in 1-1000000 (larger ones are cut to 1000000, as \
                  cyclictest does)"
                .to_string(),
        ),
    }
}

/// A value parser for a drop-in's `-D`, read as rt-tests reads it (see
/// [`crate::validate::parse_rt_duration`]); when only the real tool's reading made sense of it,
/// says on stderr how it was read.
pub fn duration_value(raw: &str) -> Result<Duration, String> {
    let (d, note) = crate::validate::parse_rt_duration(raw)?;
    if let Some(note) = note {
        eprintln!("qpw-emu: --duration {raw}: {note}");
    }
    Ok(d)
}

/// A value parser for a cyclictest run length: `0` is "until stopped".
pub fn run_length(raw: &str) -> Result<RunLength, String> {
    if raw.trim().parse::<u64>() == Ok(0) {
        return Ok(RunLength::UntilStopped);
    }
    duration_value(raw).map(RunLength::For)
}

/// getopt gives an option's required argument the next word whatever it is (`-p -5`), so that
/// the value reaches its range check instead of being taken for an option: the drop-ins' options
/// that take a value take it so too.
pub(super) fn getopt_required_argument(a: clap::Arg) -> clap::Arg {
    let required = matches!(a.get_action(), ArgAction::Set)
        && !a.is_positional()
        && a.get_num_args().is_none_or(|n| n.min_values() >= 1);
    a.allow_hyphen_values(required)
}

/// A value parser for oslat's `-w`: its busy-loop workloads only, as oslat takes them. The
/// drain workloads are `--drain-workload`; the refusal says so.
pub fn loop_workload(raw: &str) -> Result<String, String> {
    match raw {
        "no" | "memmove" => Ok(raw.to_string()),
        // A drain workload given to oslat's flag: say where it goes.
        _ if raw.parse::<crate::workload::WorkloadName>().is_ok() => Err(format!(
            "oslat's workloads are no and memmove (the drain workloads are --drain-workload \
             {raw})"
        )),
        _ => Err("oslat's workloads are no and memmove".to_string()),
    }
}

/// A value parser for a memory size as oslat writes it: `16K`, `1M`, `1G`, or bytes.
pub fn mem_size(raw: &str) -> Result<u64, String> {
    let text = raw.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let bad = || "must be a size of 1B-1G, written like 4096, 4K, 1M or 1G".to_string();
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        _ => return Err(bad()),
    };
    match n.checked_mul(mult) {
        Some(v) if (1..=1 << 30).contains(&v) => Ok(v),
        _ => Err(bad()),
    }
}
