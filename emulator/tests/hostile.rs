//! Hostile input (issue 45): each command line of the list, with the exit status and a
//! fragment of the message it must give (the flag and the legal range or the reason), and after
//! every one the system as it was: `sched_rt_runtime_us`, and nothing of the run's left behind
//! (its tracefs mount and instance, cgroups, state records, filler processes:
//! [`state::leftovers`]).
//!
//! Exit status: every refusal exits 1, as rt-tests' oslat does; cyclictest keeps 2.4's 0 for an
//! unknown option (README, "A drop-in for oslat and cyclictest").

use std::ffi::OsString;
use std::process::{Command, Stdio};

mod state;
use state::{leftovers, sysctl, wait_bounded, Restore};

/// One command line and what it must give.
struct Case {
    args: Vec<OsString>,
    code: i32,
    /// In stdout or stderr.
    says: String,
    /// Must not be said.
    not: Option<&'static str>,
}

fn case<S: AsRef<str>>(args: &[S], code: i32, says: &str) -> Case {
    Case {
        args: args.iter().map(|a| OsString::from(a.as_ref())).collect(),
        code,
        says: says.to_string(),
        not: None,
    }
}

/// A JSON file of the real cyclictest with `edit` applied.
fn edited_fixture(
    dir: &std::path::Path,
    name: &str,
    edit: impl Fn(&mut serde_json::Value),
) -> String {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rt-tests-2.4/ct-rteval.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    edit(&mut v);
    let path = dir.join(name);
    std::fs::write(&path, v.to_string()).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn hostile_input_is_refused_clearly_and_leaves_the_system_as_found() {
    state::become_subreaper();
    let before = sysctl();
    let _restore = Restore(before.clone());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let file = format!("{d}/a-file");
    std::fs::write(&file, "x").unwrap();
    let allowed = qpw_core::allowed_cpus().unwrap();
    let last = allowed.last().unwrap().to_string();
    let all = allowed.to_string();
    // With root, the refusals are asked to turn RT throttling off too: it must stay on.
    let off: &[&str] = if state::is_root() {
        &["--no-rt-throttling"]
    } else {
        &[]
    };
    let with_off =
        |args: &[&str]| -> Vec<String> { args.iter().chain(off).map(|a| a.to_string()).collect() };
    let big = "9".repeat(100_000);
    let big_count = edited_fixture(dir.path(), "count.json", |v| {
        v["thread"]["0"]["histogram"]["2"] = serde_json::json!(u64::MAX);
    });
    let big_pct = edited_fixture(dir.path(), "pct.json", |v| {
        v["percentiles"] = serde_json::json!([{"cpu": 0, "samples": 1,
            "us": {"p50": 1.0, "p90": 1.0, "p99": 1e308, "p99_9": 1e308, "p99_99": 1e308,
                   "max": 1e308}}]);
    });
    let wrong_type = edited_fixture(dir.path(), "type.json", |v| {
        v["thread"]["0"]["cycles"] = serde_json::json!("many");
    });

    let mut cases = vec![
        // Outputs that cannot be written: refused before the run (point 4).
        case(
            &with_off(&["oslat", "-c", &last, "-D", "1", "--json", "/proc/x"]),
            1,
            "--json /proc/x: cannot be created",
        ),
        case(
            &with_off(&["oslat", "-c", &last, "-D", "1", "--json", "/dev/full"]),
            1,
            "--json /dev/full: cannot be written",
        ),
        case(
            &with_off(&["cyclictest", "-D", "1", "-h", "10", "--histfile", "/proc/x"]),
            1,
            "--histfile /proc/x: cannot be created",
        ),
        case(
            &["cyclictest", "-D", "1", "-h", "10", "--histfile", &d],
            1,
            "--histfile",
        ),
        case(&["cyclictest", "-D", "1", "-F", &d], 1, "-F/--fifo"),
        case(
            &with_off(&["load", "-D", "1", "--json", "/proc/x"]),
            1,
            "--json /proc/x: cannot be created",
        ),
        case(
            &["trace", "-D", "1", "--json", "/proc/x"],
            1,
            "--json /proc/x: cannot be created",
        ),
        case(
            &["pool", "--json", "/proc/x"],
            1,
            "--json /proc/x: cannot be created",
        ),
        case(
            &["resctrl", "--json", "/proc/x"],
            1,
            "--json /proc/x: cannot be created",
        ),
        case(&["run", "-D", "1", "--out", &file], 1, "not a directory"),
        case(
            &["report", "--out", &file, &big_count],
            1,
            "not a directory",
        ),
        // report: what it reads (points 3 and 5).
        case(&["report", "/dev/urandom"], 1, "not a regular file"),
        case(&["report", &d], 1, "not a regular file"),
        case(&["report", &big_count], 1, "field `thread.0.histogram.2`"),
        case(&["report", &big_pct], 1, "1e+308 is out of range"),
        case(&["report", &wrong_type], 1, "field `thread.0.cycles`"),
        // Messages that name the flag and the legal range (point 6).
        case(&["cyclictest", "-h", "0"], 1, "1-1000000"),
        case(
            &["oslat", "-c", "18446744073709551616"],
            1,
            "cpu 18446744073709551616 is out of range",
        ),
        case(&["oslat", "-D", ""], 1, "Illegal runtime"),
        case(&["run", "-D", ""], 1, "--duration '': must be a duration"),
        case(&["run", "--rounds", &big], 1, "100000 bytes long"),
        case(&["oslat", "-w", "lru"], 1, "--drain-workload lru"),
        case(&["load", "--free", &all], 1, "--free"),
        case(
            &["load", "--load", "1"],
            1,
            "--load 1: must be `on` or `off`",
        ),
        case(
            &["load", "--load", "2"],
            1,
            "--load 2: must be `on` or `off`",
        ),
        case(
            &["load", "--stall-threshold", "5000", "--drain-timeout", "10"],
            1,
            "--stall-threshold 5000: longer than --drain-timeout 10",
        ),
        case(
            &["run", "--workloads", "lru,lru"],
            1,
            "`lru` is given twice",
        ),
        case(
            &["run", "--modes", "remote,remote"],
            1,
            "`remote` is given twice",
        ),
        case(
            &["trace", "--probe-tid", "99999999"],
            1,
            "--probe-tid 99999999: no such thread",
        ),
        // clap's own refusals exit 1 like every other (rt-tests' oslat does); cyclictest keeps
        // 2.4's 0 for an unknown option.
        case(&["run", "--bogus"], 1, "--bogus"),
        case(&["oslat", "--bogus"], 1, "unrecognized option '--bogus'"),
        case(
            &["cyclictest", "--bogus"],
            0,
            "unrecognized option '--bogus'",
        ),
    ];
    let mut not_suggested = case(
        &["oslat", "-w", "bad"],
        1,
        "oslat's workloads are no and memmove",
    );
    not_suggested.not = Some("--drain-workload bad");
    cases.push(not_suggested);
    if allowed.len() > 1 {
        cases.push(case(
            &[
                "oslat",
                "-c",
                &last,
                "--requester-cpu",
                &last,
                "--drain-workload",
                "counter",
            ],
            1,
            &format!("--requester-cpu {last}: is a measured CPU"),
        ));
        cases.push(case(
            &["load", "--free", &last, "--requester-cpu", &last],
            1,
            &format!("--requester-cpu {last}: is a measured CPU"),
        ));
    }
    // A path that is not UTF-8 works (point 2).
    {
        use std::os::unix::ffi::OsStrExt as _;
        let json = dir.path().join(std::ffi::OsStr::from_bytes(b"o\xff.json"));
        let mut c = case(&["oslat", "-q", "-D", "200ms", "-c", &last], 0, "");
        c.args.push("--json".into());
        c.args.push(json.into_os_string());
        cases.push(c);
    }

    let mut failures = Vec::new();
    for c in &cases {
        let shown = c
            .args
            .iter()
            .map(|a| {
                let a = a.to_string_lossy();
                if a.len() > 40 {
                    format!("{}...", &a[..40])
                } else {
                    a.into_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
        let mut child = Command::new(env!("CARGO_BIN_EXE_qpw-emu"))
            .args(&c.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        // Read the pipes while it runs (a usage text can fill a pipe).
        let out_reader = {
            let mut o = child.stdout.take().unwrap();
            std::thread::spawn(move || {
                let mut s = Vec::new();
                let _ = std::io::Read::read_to_end(&mut o, &mut s);
                s
            })
        };
        let mut e = child.stderr.take().unwrap();
        let err_reader = std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = std::io::Read::read_to_end(&mut e, &mut s);
            s
        });
        let status = wait_bounded(&mut child, &shown);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out_reader.join().unwrap()),
            String::from_utf8_lossy(&err_reader.join().unwrap())
        );
        let mut wrong = Vec::new();
        if status.code() != Some(c.code) {
            wrong.push(format!("exit {:?}, not {}", status.code(), c.code));
        }
        if !text.contains(&c.says) {
            wrong.push(format!("does not say `{}`", c.says));
        }
        if let Some(n) = c.not {
            if text.contains(n) {
                wrong.push(format!("says `{n}`"));
            }
        }
        if text.contains("panicked") {
            wrong.push("panicked".to_string());
        }
        if text.len() > 20_000 {
            wrong.push(format!("says {} bytes", text.len()));
        }
        if sysctl() != before {
            wrong.push(format!("left sched_rt_runtime_us at {}", sysctl()));
            let _ = std::fs::write(state::RUNTIME, &before);
        }
        let left = leftovers(pid);
        if !left.is_empty() {
            wrong.push(format!("left {left:?}"));
        }
        if !wrong.is_empty() {
            let tail: String = text
                .chars()
                .rev()
                .take(600)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            failures.push(format!("`qpw-emu {shown}`: {}\n{tail}", wrong.join("; ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}
