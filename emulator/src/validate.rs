//! Option values checked after parsing, with errors that quote the flag, the value and the
//! legal range (`--bucket-size 0: must be an integer in 1-4096`).
//!
//! Numbers, durations and CPU lists reach us as text, so that a value that is not even a number
//! gets the same message as one out of range, rather than a bare parser error.

use std::time::Duration;

use anyhow::{anyhow, Result};
use qpw_core::CpuSet;

/// A value as the messages quote it: `''` when empty, its first 64 characters and its length
/// when longer.
pub fn quote(raw: &str) -> String {
    const KEEP: usize = 64;
    if raw.is_empty() {
        return "''".to_string();
    }
    match raw.char_indices().nth(KEEP) {
        Some((cut, _)) => format!("{}... ({} bytes)", &raw[..cut], raw.len()),
        None => raw.to_string(),
    }
}

/// An integer in `lo..=hi`.
pub fn int_in(flag: &str, raw: &str, lo: u64, hi: u64) -> Result<u64> {
    match raw.trim().parse::<u64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(anyhow!(
            "{flag} {}: must be an integer in {lo}-{hi}",
            quote(raw)
        )),
    }
}

/// An integer in `lo..=hi` for a flag that may be left out: `None` when it was.
pub fn opt_int_in(flag: &str, raw: Option<&str>, lo: u64, hi: u64) -> Result<Option<u64>> {
    raw.map(|r| int_in(flag, r, lo, hi)).transpose()
}

/// A number in `lo..=hi`.
pub fn float_in(flag: &str, raw: &str, lo: f64, hi: f64) -> Result<f64> {
    match raw.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (lo..=hi).contains(&v) => Ok(v),
        _ => Err(anyhow!(
            "{flag} {}: must be a number in {lo}-{hi}",
            quote(raw)
        )),
    }
}

/// The longest run accepted: a week.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// A duration as rt-tests writes them: `10` (seconds), `30s`, `20m`, `2h`, `1d`, the unit in
/// either case; we also take `500ms` for short test runs. From 1 ms to a week.
pub fn duration(flag: &str, raw: &str) -> Result<Duration> {
    parse_duration(raw).map_err(|e| anyhow!("{flag} {}: {e}", quote(raw)))
}

/// A whole number followed by a unit (`500ms`, `200`): the number and the unit in lower case
/// (empty when there is none); `None` when it does not start with digits.
fn number_and_unit(raw: &str) -> Option<(u64, String)> {
    let text = raw.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    Some((digits.parse().ok()?, unit.to_ascii_lowercase()))
}

/// [`duration`] without the flag: the message says only what a duration must be (clap's value
/// parsers put the flag and the value in front).
pub fn parse_duration(raw: &str) -> std::result::Result<Duration, String> {
    let bad =
        || "must be a duration of 1ms to 7d, written like 10, 30s, 500ms, 20m or 2h".to_string();
    let (n, unit) = number_and_unit(raw).ok_or_else(bad)?;
    let ms_per = match unit.as_str() {
        "" | "s" => 1000,
        "ms" => 1,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    let d = n
        .checked_mul(ms_per)
        .map(Duration::from_millis)
        .ok_or_else(bad)?;
    if d.is_zero() || d > MAX_DURATION {
        return Err(bad());
    }
    Ok(d)
}

/// A duration as rt-tests 2.4 reads `-D` (its `parse_time_string`): ours first (`10`, `30s`,
/// `500ms`, `20m`, `2h`, `1d`, any case), else what the real tool makes of it: the number before
/// the first letter, in the unit of that letter (`m`, `h` or `d`; any other is seconds), the rest
/// ignored. So kubevirt's `1m0s` is a minute, as in oslat. The second value says so when the
/// real tool's reading was needed, for a warning: `1h30m` is an hour to oslat too.
pub fn parse_rt_duration(raw: &str) -> std::result::Result<(Duration, Option<String>), String> {
    if let Ok(d) = parse_duration(raw) {
        return Ok((d, None));
    }
    let text = raw.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, rest) = text.split_at(split);
    let bad = || parse_duration(raw).unwrap_err();
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let (unit, secs) = match rest.chars().next() {
        Some('m' | 'M') => ("m", 60),
        Some('h' | 'H') => ("h", 3600),
        Some('d' | 'D') => ("d", 86_400),
        _ => ("s", 1),
    };
    let d = n
        .checked_mul(secs)
        .map(Duration::from_secs)
        .filter(|d| !d.is_zero() && *d <= MAX_DURATION)
        .ok_or_else(bad)?;
    Ok((
        d,
        Some(format!(
            "read as {n}{unit} ({} s), as rt-tests 2.4 reads it: the number, then the unit of \
             the first letter after it, and the rest ignored",
            d.as_secs()
        )),
    ))
}

/// The parent directory of an output file must exist before a run starts, so that a typo in
/// `--json` costs nothing (`-` is stdout).
pub fn output_file(flag: &str, path: &std::path::Path) -> Result<()> {
    if path.as_os_str() == "-" {
        return Ok(());
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    if !parent.is_dir() {
        return Err(anyhow!(
            "{flag} {}: the directory {} does not exist",
            path.display(),
            parent.display()
        ));
    }
    if path.is_dir() {
        return Err(anyhow!(
            "{flag} {}: is a directory, not a file",
            path.display()
        ));
    }
    writable(flag, path)
}

/// Opens `path` for writing now, so that an output that cannot be written (`/proc/x`, a
/// read-only file, `/dev/full`) is refused before the run instead of losing its results after
/// it: an existing file is opened (not truncated) and written zero bytes (a device that refuses
/// every write refuses that too); a missing one is created, then removed again. A named pipe or
/// a socket is taken as it is (its reader may come later).
fn writable(flag: &str, path: &std::path::Path) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let refused = |e: std::io::Error| anyhow!("{flag} {}: cannot be written: {e}", path.display());
    if let Ok(meta) = std::fs::metadata(path) {
        let kind = meta.file_type();
        if kind.is_fifo() || kind.is_socket() {
            return Ok(());
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(refused)?;
        return f.write(&[]).map(drop).map_err(refused);
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| anyhow!("{flag} {}: cannot be created: {e}", path.display()))?;
    let _ = std::fs::remove_file(path);
    Ok(())
}

/// A folder for output files (`--out`): made if missing, and refused up front, naming `flag`,
/// when it is a file or cannot be written in.
pub fn output_dir(flag: &str, dir: &std::path::Path) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(anyhow!(
            "{flag} {}: not a directory (it is a file): give a folder, which is made if missing",
            dir.display()
        ));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow!("{flag} {}: cannot create the folder: {e}", dir.display()))?;
    let probe = dir.join(format!(".qpw-emu-write-test-{}", std::process::id()));
    std::fs::File::create(&probe)
        .map_err(|e| anyhow!("{flag} {}: cannot write in the folder: {e}", dir.display()))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

/// A CPU list (`1,3-5`) whose CPUs the process may all run on.
///
/// libnuma's forms, which the real tools take, are taken too: `all` (every allowed CPU),
/// `!LIST` (the allowed CPUs but those), and `+LIST` (positions in the allowed set: `+0-1` is
/// its first two CPUs).
pub fn cpu_list(flag: &str, raw: &str, allowed: &CpuSet) -> Result<CpuSet> {
    let text = raw.trim();
    let raw = &quote(raw);
    let parse = |list: &str| {
        CpuSet::parse(list).map_err(|e| match e {
            // The number as given, not as it was read (18446744073709551616 saturates).
            qpw_core::Error::CpuOutOfRange { max, .. } => {
                let given = list
                    .split(|c: char| !c.is_ascii_digit())
                    .find(|t| !t.is_empty() && t.parse::<usize>().map_or(true, |n| n > max))
                    .unwrap_or(list);
                anyhow!(
                    "{flag} {raw}: cpu {} is out of range: CPU numbers go from 0 to {max}",
                    quote(given)
                )
            }
            e => anyhow!("{flag} {raw}: {e}"),
        })
    };
    let set = if text == "all" {
        allowed.clone()
    } else if let Some(rest) = text.strip_prefix('!') {
        allowed.difference(&parse(rest)?)
    } else if let Some(rest) = text.strip_prefix('+') {
        let positions = parse(rest)?;
        let picked: Option<CpuSet> = positions
            .iter()
            .map(|i| allowed.as_slice().get(i).copied())
            .collect();
        picked.ok_or_else(|| {
            anyhow!(
                "{flag} {raw}: positions beyond the {} allowed CPUs ({allowed})",
                allowed.len()
            )
        })?
    } else {
        parse(text)?
    };
    if set.is_empty() {
        return Err(anyhow!(
            "{flag} {raw}: the list is empty; give CPUs from the allowed set {allowed}"
        ));
    }
    let outside = set.difference(allowed);
    if !outside.is_empty() {
        return Err(anyhow!(
            "{flag} {raw}: cpu {outside} not in the allowed set {allowed}"
        ));
    }
    Ok(set)
}

/// A single CPU the process may run on.
pub fn cpu(flag: &str, raw: &str, allowed: &CpuSet) -> Result<usize> {
    let last = allowed.last().unwrap_or(0);
    match raw.trim().parse::<usize>() {
        Ok(c) if allowed.contains(c) => Ok(c),
        _ => Err(anyhow!(
            "{flag} {}: must be one CPU of the allowed set {allowed} (0-{last})",
            quote(raw)
        )),
    }
}

/// `on` or `off`.
pub fn on_off(flag: &str, raw: &str) -> Result<bool> {
    // Only the two words the help gives: `1` passed where `2` was refused.
    match raw.trim() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(anyhow!("{flag} {}: must be `on` or `off`", quote(raw))),
    }
}

/// How often the probe does a local operation (`--local-op-every`): a number of microseconds
/// as before (`200`), or a time with its unit (`250ns`, `1us`, `2ms`); 0 means every turn of
/// the probe's loop. At most one second.
pub fn op_interval(flag: &str, raw: &str) -> Result<Duration> {
    let bad = || {
        anyhow!(
            "{flag} {}: must be 0 to 1s, in microseconds (200) or with a unit (250ns, 1us, \
             2ms)",
            quote(raw)
        )
    };
    let (n, unit) = number_and_unit(raw).ok_or_else(bad)?;
    let ns_per = match unit.as_str() {
        "" | "us" => 1_000,
        "ns" => 1,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return Err(bad()),
    };
    let ns = n.checked_mul(ns_per).ok_or_else(bad)?;
    if ns > 1_000_000_000 {
        return Err(bad());
    }
    Ok(Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("-D", "10").unwrap(), Duration::from_secs(10));
        assert_eq!(duration("-D", "30s").unwrap(), Duration::from_secs(30));
        assert_eq!(duration("-D", "20m").unwrap(), Duration::from_secs(1200));
        assert_eq!(duration("-D", "2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(duration("-D", "500ms").unwrap(), Duration::from_millis(500));
        for bad in ["0", "", "x", "10x", "-1", "8d", "99999999999999999999"] {
            let e = duration("--duration", bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--duration {}:", quote(bad))), "{e}");
            assert!(e.contains("1ms to 7d"), "{e}");
        }
    }

    /// The drop-ins' `-D` as rt-tests 2.4's `parse_time_string` reads it: kubevirt passes
    /// `--duration 1m0s` to oslat, which runs a minute; ours refused it (issue 25).
    #[test]
    fn rt_durations_read_as_the_real_tools_read_them() {
        let read =
            |raw: &str| parse_rt_duration(raw).map(|(d, note)| (d.as_secs(), note.is_some()));
        assert_eq!(read("1m0s"), Ok((60, true)));
        assert_eq!(read("1h30m"), Ok((3600, true)));
        assert_eq!(read("10x"), Ok((10, true)));
        assert_eq!(read("2H"), Ok((7200, false)));
        assert_eq!(read("20M"), Ok((1200, false)));
        assert_eq!(read("30s"), Ok((30, false)));
        assert_eq!(
            parse_rt_duration("500ms").map(|(d, n)| (d, n.is_some())),
            Ok((Duration::from_millis(500), false))
        );
        for bad in ["", "abc", "0", "0m1s", "-5", "8d", "99999999999999999999"] {
            assert!(
                parse_rt_duration(bad).unwrap_err().contains("1ms to 7d"),
                "{bad}"
            );
        }
    }

    #[test]
    fn numbers_name_flag_and_range() {
        assert_eq!(int_in("-b", "32", 1, 4096).unwrap(), 32);
        assert_eq!(
            int_in("--bucket-size", "0", 1, 4096)
                .unwrap_err()
                .to_string(),
            "--bucket-size 0: must be an integer in 1-4096"
        );
        assert!(int_in("-b", "x", 1, 2)
            .unwrap_err()
            .to_string()
            .contains("1-2"));
        assert_eq!(opt_int_in("-f", None, 1, 99).unwrap(), None);
        assert_eq!(opt_int_in("-f", Some("7"), 1, 99).unwrap(), Some(7));
        assert_eq!(
            opt_int_in("--rtprio", Some("0"), 1, 99)
                .unwrap_err()
                .to_string(),
            "--rtprio 0: must be an integer in 1-99"
        );
        assert!(float_in("--drain-rate", "nan", 0.0, 10.0).is_err());
        assert_eq!(float_in("--drain-rate", "2.5", 0.0, 10.0).unwrap(), 2.5);
    }

    #[test]
    fn cpu_lists() {
        let allowed = CpuSet::parse("0-1").unwrap();
        assert_eq!(cpu_list("-c", "1", &allowed).unwrap().to_string(), "1");
        let e = cpu_list("--cpu-list", "5", &allowed)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--cpu-list 5") && e.contains("0-1"), "{e}");
        let e = cpu_list("-c", "3-1", &allowed).unwrap_err().to_string();
        assert!(e.contains("-c 3-1"), "{e}");
        assert!(cpu("--target", "7", &allowed).is_err());
    }

    #[test]
    fn op_interval_takes_microseconds_or_a_unit() {
        use std::time::Duration;
        let d = |raw| super::op_interval("--local-op-every", raw).unwrap();
        assert_eq!(d("200"), Duration::from_micros(200));
        assert_eq!(d("100ns"), Duration::from_nanos(100));
        assert_eq!(d("1us"), Duration::from_micros(1));
        assert_eq!(d("2ms"), Duration::from_millis(2));
        assert_eq!(d("0"), Duration::ZERO);
        for bad in ["", "-1", "1.5", "2s", "10min", "abc"] {
            let e = super::op_interval("--local-op-every", bad)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("--local-op-every") && e.contains("0 to 1s"),
                "{bad}: {e}"
            );
        }
    }
}
