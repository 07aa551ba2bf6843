//! The command line, run as a user runs it: short probe runs that must exit 0, the JSON they
//! write (the rt-tests envelope and per-thread keys), and every numeric flag, CPU list and
//! duration given a bad value, which must fail with an error that names the flag and its legal
//! range. Runs are kept to about a second.

use std::path::Path;

use assert_cmd::Command;
use predicates::prelude::*;
use serde_json::Value;

fn emu() -> Command {
    let mut cmd = Command::cargo_bin("qpw-emu").expect("the qpw-emu binary is built");
    cmd.timeout(std::time::Duration::from_secs(60));
    cmd
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("the JSON file was written");
    serde_json::from_str(&text).expect("the JSON file parses")
}

/// Runs `qpw-emu` with the arguments of `line` (split at spaces) and `--json DIR/NAME`; the run
/// must succeed with `output_has` in its output (stdout, or stderr, where the drop-ins' own
/// `# qpw-emu` lines go). Returns the JSON it wrote.
fn run_json(dir: &Path, name: &str, line: &str, output_has: &str) -> Value {
    let file = dir.join(name);
    let out = emu()
        .args(line.split(' '))
        .arg("--json")
        .arg(&file)
        .assert()
        .success()
        .get_output()
        .clone();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(output_has), "`{output_has}` not in:\n{text}");
    read_json(&file)
}

fn assert_envelope(v: &Value) {
    for key in [
        "file_version",
        "cmdline:",
        "rt_test_version:",
        "start_time",
        "end_time",
        "return_code",
        "sysinfo",
        "num_threads",
        "thread",
    ] {
        assert!(v.get(key).is_some(), "envelope key `{key}` missing in {v}");
    }
    assert_eq!(v["file_version"], 1);
    for key in [
        "sysname", "nodename", "release", "version", "machine", "realtime",
    ] {
        assert!(v["sysinfo"].get(key).is_some(), "sysinfo.{key} missing");
    }
}

#[test]
fn smoke_oslat_writes_rt_tests_json() {
    let dir = tempfile::tempdir().unwrap();
    let v = run_json(dir.path(), "oslat.json", "oslat -D 1 -q", "Maximum:");
    assert_envelope(&v);
    let t = &v["thread"]["0"];
    for key in ["cpu", "freq", "min", "avg", "max", "duration", "histogram"] {
        assert!(
            t.get(key).is_some(),
            "oslat thread key `{key}` missing in {t}"
        );
    }
    let hist = t["histogram"].as_object().unwrap();
    assert!(!hist.is_empty());
    assert!(
        hist.values().all(|c| c.as_u64().unwrap() > 0),
        "only non-zero buckets"
    );
    assert_eq!(v["tool"], "oslat");
    assert!(v["warnings"].is_array());
}

#[test]
fn smoke_cyclictest_writes_rt_tests_json() {
    let dir = tempfile::tempdir().unwrap();
    let v = run_json(
        dir.path(),
        "cyclictest.json",
        "cyclictest -D 1 -i 1000 -m -q -h 100",
        "# Max Latencies",
    );
    assert_envelope(&v);
    assert!(v.get("resolution_in_ns").is_some());
    let t = &v["thread"]["0"];
    for key in ["histogram", "cycles", "min", "max", "avg", "cpu", "node"] {
        assert!(
            t.get(key).is_some(),
            "cyclictest thread key `{key}` missing in {t}"
        );
    }
    // At most about 1000 wake-ups in a second at 1000 us (deadlines are absolute, and a late
    // wake-up is not made up by extra ones); how many of them a busy machine grants a
    // SCHED_OTHER thread is not this test's business, only that it woke.
    let cycles = t["cycles"].as_u64().unwrap();
    assert!((1..=1100).contains(&cycles), "cycles {cycles}");
}

#[test]
fn oslat_under_each_mode_reports_the_requester() {
    let dir = tempfile::tempdir().unwrap();
    for mode in ["queue", "remote", "fenced"] {
        let v = run_json(
            dir.path(),
            &format!("{mode}.json"),
            &format!("oslat -c 1 -D 1 -q --drain-workload counter --mode {mode}"),
            "requester",
        );
        assert_eq!(v["mode"], mode);
        assert_eq!(v["workload"], "counter");
        assert!(v["requester"]["drains"].as_u64().unwrap() > 0);
        assert!(v["percentiles"][0]["us"]["p99_9"].is_number());
        let conservation = v["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("conservation"));
        assert!(!conservation, "conservation failed: {}", v["warnings"]);
    }
}

#[test]
fn load_runs_for_its_duration_and_report_reads_results() {
    let dir = tempfile::tempdir().unwrap();
    let v = run_json(
        dir.path(),
        "load.json",
        "load -D 500ms -q --mode remote --workload counter",
        "requester",
    );
    assert!(v.get("cmdline:").is_some());
    assert!(v["requester"]["drains"].as_u64().unwrap() > 0);

    run_json(dir.path(), "o.json", "oslat -D 500ms -q", "Maximum:");
    emu()
        .arg("report")
        .arg(dir.path().join("o.json"))
        .args(["--out"])
        .arg(dir.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("p99.9"));
    assert!(dir.path().join("report-oslat-hist.svg").exists());
    assert!(dir.path().join("report-oslat-ccdf.svg").exists());
}

/// Runs each case's command line (`qpw-emu` arguments split at spaces), expecting failure with
/// `Error: ` (our check) or clap's `error: invalid value` (a value parser's) and both of its
/// needles in stderr.
fn rejects_all(cases: &[(&str, [&str; 2])]) {
    for (line, needles) in cases {
        let args: Vec<&str> = line.split(' ').collect();
        let out = emu().args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        // Ours, or (oslat's -D and -b) after oslat's own line on stdout.
        assert!(
            err.starts_with("Error: ")
                || err.starts_with("error: invalid value")
                || err.starts_with("qpw-emu: invalid value"),
            "{args:?}: {err}"
        );
        for n in needles {
            assert!(err.contains(n), "{args:?}: `{n}` not in: {err}");
        }
    }
}

/// oslat 2.4's refusals, as recorded from Debian's rt-tests 2.4 on this machine (issue 25):
/// wrappers grep these lines and check the exit status.
#[test]
fn oslat_refuses_as_oslat_does() {
    // (command line, exit status, stdout starts with, stderr has)
    let cases = [
        (
            "oslat -x",
            "oslat V 2.40\nUsage:\noslat <options>\n",
            "oslat: invalid option -- 'x'",
        ),
        (
            "oslat --bogus",
            "oslat V 2.40\nUsage:\n",
            "oslat: unrecognized option '--bogus'",
        ),
        (
            "oslat -D",
            "oslat V 2.40\nUsage:\n",
            "oslat: option requires an argument -- 'D'",
        ),
        (
            "oslat -D abc",
            "oslat V 2.40\nIllegal runtime: abc\n",
            "1ms to 7d",
        ),
        (
            "oslat -b 2000",
            "oslat V 2.40\nIllegal bucket size: 2000 (should be: 4-1024)\n",
            "4-1024",
        ),
        (
            "oslat -f abc",
            "oslat V 2.40\nIllegal RT priority: abc (should be: 1-99)\n",
            "1-99",
        ),
        (
            "oslat -T -3",
            "oslat V 2.40\nParameter --trace-threshold needs to be positive\n",
            "1-10000000",
        ),
        (
            "oslat -m 5Q",
            "oslat V 2.40\nUnknown workload memory size '5Q'.\n\n",
            "1B-1G",
        ),
        ("oslat -c x", "oslat V 2.40\n", "--cpu-list x"),
        (
            "oslat -C 999",
            "oslat V 2.40\nIllegal core for main thread: 999 (should be: 0-",
            "--cpu-main-thread 999",
        ),
        // Issue 25 class 6: oslat's -w takes oslat's workloads only; ours have a long name
        // of their own, and -W (ours, a bucket width) is no longer a short option.
        (
            "oslat -w lru",
            "oslat V 2.40\nUnknown workload 'lru'.  Please choose from: 'no', 'memmove'\n\n",
            "--drain-workload lru",
        ),
        (
            "oslat --workload=counter",
            "oslat V 2.40\nUnknown workload 'counter'.  Please choose from: 'no', 'memmove'\n\n",
            "--drain-workload counter",
        ),
        (
            "oslat -W 500",
            "oslat V 2.40\nUsage:\n",
            "oslat: invalid option -- 'W'",
        ),
    ];
    for (line, stdout_starts, stderr_has) in cases {
        let out = emu().args(line.split(' ')).output().unwrap();
        let (so, se) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(1), "{line}: {so}{se}");
        assert!(so.starts_with(stdout_starts), "{line}: stdout:\n{so}");
        assert!(se.contains(stderr_has), "{line}: stderr:\n{se}");
    }
    // --help starts as oslat's, and lists ours after oslat's options, under their heading.
    let out = emu().args(["oslat", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        help.starts_with("oslat V 2.40\nUsage:\noslat <options>\n"),
        "{help}"
    );
    let (real, ours) = help
        .split_once("Options of qpw-emu (not in rt-tests):")
        .expect("our heading");
    assert!(
        real.contains("--bucket-size") && real.contains("--zero-omit"),
        "{help}"
    );
    assert!(ours.contains("--mode") && ours.contains("--bucket-width") && ours.contains("--trace"));
    assert!(
        !real.contains("--mode") && !real.contains("--bucket-width"),
        "{help}"
    );
}

/// Quirks scripts rely on, as rt-tests 2.4 has them (issue 25 class 4): words that are not
/// options are ignored by both tools (ours say so on stderr); an unknown long option makes
/// cyclictest print its usage and exit 0.
#[test]
fn stray_words_and_unknown_long_options_as_rt_tests_take_them() {
    for line in [
        "oslat -c 0 -D 100ms -q extra words",
        "cyclictest -l 5 -q extra",
    ] {
        let out = emu().args(line.split(' ')).output().unwrap();
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{line}: {se}");
        assert!(se.contains("ignoring `extra"), "{line}: {se}");
    }
    let out = emu().args(["cyclictest", "--bogus"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(
        se.contains("cyclictest: unrecognized option '--bogus'"),
        "{se}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage:"));
}

/// A flag given twice takes its last value, as getopt's loop in both tools does (scripts add
/// an override after their defaults); before, clap refused the second with exit 2.
#[test]
fn a_repeated_flag_takes_its_last_value() {
    let dir = tempfile::tempdir().unwrap();
    let v = run_json(
        dir.path(),
        "o.json",
        "oslat -c 0 -c 1 -D 100ms -D 200ms -q -q",
        "Maximum",
    );
    assert_eq!(v["thread"]["0"]["cpu"], 1, "{v}");
    let v = run_json(
        dir.path(),
        "c.json",
        "cyclictest -l 5 -l 10 -a 0 -a 1 -q -q",
        "T: 0",
    );
    assert_eq!(v["thread"]["0"]["cycles"], 10, "{v}");
    assert_eq!(v["thread"]["0"]["cpu"], 1, "{v}");
}

/// cyclictest 2.4's refusals and order rules, as recorded from Debian's rt-tests 2.4 on this
/// machine (issue 25 classes 4 and 5): wrappers check the exit status and grep these lines.
#[test]
fn cyclictest_refuses_and_reads_its_command_line_as_cyclictest_does() {
    const USAGE: &str = "cyclictest V 2.40\nUsage:\ncyclictest <options>\n";
    // (command line, exit status, stdout starts with, stderr has)
    let cases = [
        (
            "cyclictest -k",
            0,
            USAGE,
            "cyclictest: invalid option -- 'k'",
        ),
        (
            "cyclictest -l 3 -i",
            0,
            USAGE,
            "cyclictest: option requires an argument -- 'i'",
        ),
        ("cyclictest -p 200", 1, USAGE, "0-99"),
        // getopt gives a required argument the next word, dash or not.
        ("cyclictest -h -1", 1, USAGE, "--histogram"),
        ("cyclictest -c 5", 1, USAGE, "0-1"),
        // -a before --smp is fatal; the other order only warns.
        (
            "cyclictest -a 1 --smp -l 3 -q",
            1,
            "",
            "FATAL: numa and smp options are mutually exclusive",
        ),
        (
            "cyclictest -qa0 -S -l 3",
            1,
            "",
            "FATAL: numa and smp options are mutually exclusive",
        ),
        (
            "cyclictest --smp -a 1 -l 3 -q",
            0,
            "",
            "WARN: -a ignored due to smp mode",
        ),
    ];
    for (line, code, stdout_starts, stderr_has) in cases {
        let out = emu().args(line.split(' ')).output().unwrap();
        let (so, se) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(code), "{line}: {so}{se}");
        assert!(so.starts_with(stdout_starts), "{line}: stdout:\n{so}");
        assert!(se.contains(stderr_has), "{line}: stderr:\n{se}");
    }
    let run = |line: &str| {
        let out = emu().args(line.split(' ')).output().unwrap();
        let (so, se) = (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        );
        assert!(out.status.success(), "{line}: {so}{se}");
        (so, se)
    };
    // -t takes the next word only when it is a number: `abc` is ignored and -t means a
    // thread per allowed CPU.
    let allowed = qpw_core::allowed_cpus().unwrap().len();
    let (so, se) = run("cyclictest -t abc -l 3 -q");
    assert_eq!(
        so.lines().filter(|l| l.starts_with("T:")).count(),
        allowed,
        "{so}"
    );
    assert!(se.contains("ignoring `abc`"), "{se}");
    let (so, _) = run("cyclictest -t 1 -l 3 -q");
    assert_eq!(
        so.lines().filter(|l| l.starts_with("T:")).count(),
        1,
        "{so}"
    );
    // -v: `Using N cpus.` once more when -v comes before -a, and each thread's interval as
    // 2.4 prints it (plus one distance, none with a histogram).
    let (so, _) = run("cyclictest -v -a 0 -t 1 -l 2");
    assert!(so.starts_with("Using 1 cpus.\nMax CPUs = "), "{so}");
    let (so, _) = run("cyclictest -a 0 -v -t 1 -l 2");
    assert!(so.starts_with("Max CPUs = "), "{so}");
    assert_eq!(so.matches("Using 1 cpus.").count(), 1, "{so}");
    let (so, _) = run("cyclictest -v -t 2 -a 0 -i 1000 -l 2");
    assert!(
        so.contains("Thread 0 Interval: 1500\n") && so.contains("Thread 1 Interval: 2000\n"),
        "{so}"
    );
    let (so, _) = run("cyclictest -v -t 2 -a 0 -i 1000 -h 10 -l 2");
    assert!(
        so.contains("Thread 0 Interval: 1000\n") && so.contains("Thread 1 Interval: 1000\n"),
        "{so}"
    );
}

#[test]
fn bad_oslat_values_name_the_flag_and_range() {
    rejects_all(&[
        ("oslat -b 0", ["'--bucket-size <N>'", "4-1024"]),
        ("oslat -b x", ["'x'", "4-1024"]),
        ("oslat -b 3", ["'3'", "4-1024"]),
        ("oslat -b 1025", ["'1025'", "4-1024"]),
        ("oslat --bucket-width 0", ["--bucket-width", "1-1000000"]),
        ("oslat -f 0", ["--rtprio", "1-99"]),
        ("oslat -f 100", ["'100'", "1-99"]),
        ("oslat -T 0", ["--trace-threshold", "1-10000000"]),
        ("oslat -D 0", ["--duration", "1ms to 7d"]),
        ("oslat -D x10", ["'x10'", "1ms to 7d"]),
        ("oslat -D 8d", ["'8d'", "1ms to 7d"]),
        ("oslat -m 5Q", ["--workload-mem", "4K, 1M or 1G"]),
        ("oslat -c 1-", ["--cpu-list 1-", "0,2-5"]),
        ("oslat -c 4000", ["--cpu-list 4000", "0 to 1023"]),
        ("oslat -c 1023", ["--cpu-list 1023", "allowed set"]),
        ("oslat -C 999", ["--cpu-main-thread 999", "allowed set"]),
        ("oslat --drain-rate -1", ["--drain-rate -1", "0-100000"]),
        ("oslat --drain-rate abc", ["--drain-rate abc", "0-100000"]),
        (
            "oslat --local-op-every 2s",
            ["--local-op-every 2s", "0 to 1s"],
        ),
        ("oslat --drain-timeout 0", ["--drain-timeout 0", "1-60000"]),
        (
            "oslat --stall-threshold 0",
            ["--stall-threshold 0", "1-60000"],
        ),
        (
            "load --stall-threshold 60001",
            ["--stall-threshold 60001", "1-60000"],
        ),
        ("oslat --load maybe", ["--load maybe", "`on` or `off`"]),
        ("oslat --mode fast", ["--mode fast", "`remote` or `fenced`"]),
        (
            "oslat --drain-workload slab",
            ["--drain-workload slab", "lru, memcg, slub, pcp, counter"],
        ),
        (
            "cyclictest --workload slab",
            ["--workload slab", "lru, memcg, slub, pcp, counter"],
        ),
        (
            "oslat --requester-cpu 999",
            ["--requester-cpu 999", "allowed set"],
        ),
        // A load needs a CPU that is not measured, and oslat measures all by default.
        (
            "oslat --mode queue",
            ["no CPU is left for the requester", "measured"],
        ),
    ]);
}

#[test]
fn bad_cyclictest_values_name_the_flag_and_range() {
    rejects_all(&[
        // Attached: a separate word that is not a number is not -t's or -a's in 2.4 (below).
        ("cyclictest -t0", ["--threads", "1-4096"]),
        ("cyclictest -p -5", ["--priority", "0-99"]),
        ("cyclictest -p 100", ["--priority", "0-99"]),
        ("cyclictest -i 0", ["--interval", "1-10000000"]),
        ("cyclictest -h 0", ["--histogram", "1-1000000"]),
        ("cyclictest -c 2", ["--clock", "0-1"]),
        ("cyclictest -D y2", ["--duration", "1ms to 7d"]),
        ("cyclictest -ax", ["--affinity x", "not a CPU number"]),
        (
            "cyclictest --policy deadline",
            ["--policy deadline", "fifo, rr"],
        ),
        ("cyclictest -o 2", ["-o/--oscope", "-v"]),
        ("cyclictest -A --secaligned", ["--secaligned", "not both"]),
        ("cyclictest --smi", ["--smi: not supported", "MSR"]),
        (
            "cyclictest --drain-rate 1e9",
            ["--drain-rate 1e9", "0-100000"],
        ),
        (
            "cyclictest --json /nonexistent/dir/x.json",
            ["/nonexistent/dir", "does not exist"],
        ),
    ]);
}

#[test]
fn bad_run_and_load_values_name_the_flag_and_range() {
    rejects_all(&[
        ("run -D 0", ["--duration 0", "1ms to 7d"]),
        ("run --drain-rate 0", ["--drain-rate 0", "1-100000"]),
        ("run --target 999", ["--target 999", "allowed set"]),
        ("run -f 0", ["--rtprio 0", "1-99"]),
        (
            "run --modes queue,fast",
            [
                "--modes queue,fast",
                "`fast` is not queue, remote or fenced",
            ],
        ),
        (
            "run --local-op-every 5x",
            ["--local-op-every 5x", "0 to 1s"],
        ),
        (
            "run --workloads lru,foo",
            ["--workloads lru,foo", "unknown workload `foo`"],
        ),
        ("load -D 0", ["--duration 0", "1ms to 7d"]),
        ("load --free 5-2", ["--free 5-2", "runs backwards"]),
        ("load --drain-rate x", ["--drain-rate x", "0-100000"]),
        (
            "load -D 5 --json /nonexistent/l.json",
            ["/nonexistent", "does not exist"],
        ),
        (
            "pool --json /nonexistent/p.json",
            ["/nonexistent", "does not exist"],
        ),
        (
            "resctrl --json /nonexistent/r.json",
            ["/nonexistent", "does not exist"],
        ),
    ]);
}

#[test]
fn pool_figures_print_and_export() {
    let dir = tempfile::tempdir().unwrap();
    let v = run_json(
        dir.path(),
        "pool.json",
        "pool -q --loops 10",
        "percpu-pools",
    );
    assert!(v.get("cmdline:").is_some());
    let runs = v["runs"].as_array().unwrap();
    assert!(!runs.is_empty());
    assert!(runs
        .iter()
        .all(|r| r["corrupt"] == 0 && r["violations"] == 0));
}

#[test]
fn bad_figures_values_name_the_flag_and_range() {
    rejects_all(&[
        ("resctrl --groups 0", ["--groups 0", "1-4095"]),
        ("resctrl --passes 1001", ["--passes 1001", "1-1000"]),
        ("pool --loops -3", ["--loops -3", "1-100000"]),
    ]);
}

/// Runs the default experiment on the built-in counter workload for `duration` in `rounds`
/// rounds, writing to `dir`; it must succeed with `stdout_has` in its output. Returns the
/// summary it wrote.
fn run_counter_experiment(dir: &Path, duration: &str, rounds: u32, stdout_has: &str) -> Value {
    emu()
        .args(["run", "-D", duration, "--rounds", &rounds.to_string()])
        .args(["--workloads", "counter", "--out"])
        .arg(dir)
        .assert()
        .success()
        .stdout(predicate::str::contains(stdout_has));
    read_json(&dir.join("summary.json"))
}

/// A short default experiment: every scenario's JSON carries the excess interruptions per drain
/// of each round, and the table's figure is their median.
#[test]
fn run_reports_excess_interruptions_round_by_round() {
    let dir = tempfile::tempdir().unwrap();
    let summary = run_counter_experiment(dir.path(), "1200ms", 3, "median of the rounds");
    assert_eq!(summary["rounds"], 3);
    // The threshold is fixed (issue 27), and the counts at other thresholds come with it.
    assert_eq!(summary["threshold_us"].as_f64(), Some(5.0));
    let rows = summary["rows"].as_array().unwrap();
    for name in ["queue-counter", "remote-counter"] {
        let v = read_json(&dir.path().join(format!("{name}.json")));
        let i = &v["interruptions"];
        let at: Vec<(f64, f64)> = serde_json::from_value(i["per_second_at_us"].clone()).unwrap();
        assert_eq!(
            at.iter().map(|a| a.0).collect::<Vec<_>>(),
            [2.0, 5.0, 10.0, 20.0],
            "{i}"
        );
        assert_eq!(at[1].1, i["per_second"].as_f64().unwrap(), "{i}");
        assert!(
            at.windows(2).all(|w| w[0].1 >= w[1].1),
            "a higher threshold, fewer: {i}"
        );
        let by_round = i["excess_per_drain_by_round"].as_array().unwrap();
        assert_eq!(by_round.len(), 3, "{name}: {i}");
        let mut known: Vec<f64> = by_round.iter().filter_map(Value::as_f64).collect();
        known.sort_by(f64::total_cmp);
        let row = rows.iter().find(|r| r["name"] == name).unwrap();
        match known.len() {
            0 => assert!(i["excess_per_drain_median"].is_null(), "{name}: {i}"),
            n => {
                let median = if n % 2 == 1 {
                    known[n / 2]
                } else {
                    (known[n / 2 - 1] + known[n / 2]) / 2.0
                };
                // To the last bits: the rounds' figures and the median are worked out along
                // different sums, so an even count's mean of two may differ in its last bit
                // (0.8311417374465533 against ...532, once, when a busy machine left a round
                // out; with three rounds the median is one of them, and exact).
                let close = |v: Option<f64>| {
                    v.is_some_and(|v| (v - median).abs() <= 1e-9 * median.abs().max(1.0))
                };
                assert!(
                    close(i["excess_per_drain_median"].as_f64()),
                    "{name}: {:?} against {median}",
                    i["excess_per_drain_median"]
                );
                assert!(
                    close(row["excess_per_drain"].as_f64()),
                    "{name}: {:?} against {median}",
                    row["excess_per_drain"]
                );
                assert_eq!(
                    i["excess_per_drain_se"].is_number(),
                    n >= 2,
                    "{name}: a standard error with two rounds or more: {i}"
                );
            }
        }
    }
}

/// The default experiment reports the probe's context switches per drain (involuntary and
/// voluntary, each counted in the JSON): one or two per drain in queue mode (the worker's
/// wake-up preempts the probe, and the probe may then sleep on the lock the worker holds), and
/// about none in remote mode. Other processes on the machine can preempt the probe in every
/// scenario too: the assertion is on the difference, not on a zero, and it is made only where
/// those preemptions, as the idle baseline of the same run counted them, are too few per drain
/// to hide it. On a busy machine (a build, `stress-ng --cpu 2`) the requester gets a fraction of
/// its CPU, drains fall to about a hundred a second while others' preemptions stay at tens a
/// second, and two scenarios of the same run differed by twice that noise: no bound on a
/// difference of a fraction of a switch per drain holds there. The claim itself is asserted
/// exactly, on any machine, with `SCHED_FIFO` in `tests/central_claim.rs`, and by the trace's
/// attribution in `kernel_trace.rs`; what this test always checks is the report: the figure is
/// the probe's switches over the drains, in the JSON and the table alike.
#[test]
fn run_reports_probe_preemptions_per_drain() {
    let dir = tempfile::tempdir().unwrap();
    let summary = run_counter_experiment(dir.path(), "1s", 1, "preempt");
    let rows = summary["rows"].as_array().unwrap();
    let per_drain = |name: &str| {
        let v = read_json(&dir.path().join(format!("{name}.json")));
        let p = &v["probe_preemptions"];
        let drains = p["drains_reaching_target"].as_u64().unwrap();
        assert!(drains > 0, "{name}: no drain reached the target: {p}");
        // Every switch counts: involuntary (preempted) and voluntary (it slept on its lock).
        let count = p["count"].as_u64().unwrap() + p["voluntary"].as_u64().unwrap();
        let figure = p["per_drain_median"].as_f64().unwrap();
        // One round: the median is the pooled figure (up to JSON's last digit).
        let pooled = count as f64 / drains as f64;
        assert!(
            (figure - pooled).abs() < 1e-9,
            "{name}: {figure} vs {pooled}"
        );
        let row = rows.iter().find(|r| r["name"] == name).unwrap();
        assert_eq!(
            row["preemptions_per_drain"].as_f64(),
            Some(figure),
            "{name}"
        );
        figure
    };
    let (queue, remote) = (per_drain("queue-counter"), per_drain("remote-counter"));
    let fenced = per_drain("fenced-counter");
    // Others' preemptions of the probe: the idle baseline's rate (it runs no drain, so every
    // switch it counts is someone else's), scaled to each scenario's time over its drains.
    let baseline = read_json(&dir.path().join("idle.json"));
    let p = &baseline["probe_preemptions"];
    let idle_switches = p["count"].as_u64().unwrap() + p["voluntary"].as_u64().unwrap();
    let idle_rate = idle_switches as f64 / baseline["thread"]["0"]["duration"].as_f64().unwrap();
    let noise = |name: &str| {
        let v = read_json(&dir.path().join(format!("{name}.json")));
        let drains = v["probe_preemptions"]["drains_reaching_target"]
            .as_u64()
            .unwrap();
        idle_rate * v["thread"]["0"]["duration"].as_f64().unwrap() / drains as f64
    };
    let worst = ["queue-counter", "remote-counter", "fenced-counter"]
        .map(|name| (noise(name), name))
        .into_iter()
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap();
    // A tenth of a switch per drain: doubled, as a burst of someone else's work may do to one
    // scenario, it stays inside the margins below.
    if worst.0 > 0.1 {
        eprintln!(
            "others preempted the probe {idle_rate:.0} times a second in the idle baseline, \
             about {:.2} per drain in {}: the modes' difference (queue {queue:.2}, remote \
             {remote:.2}, fenced {fenced:.2}) is not decided on this run",
            worst.0, worst.1
        );
    } else {
        // Queue mode: the worker's wake-up takes the CPU from the probe once per drain, and a
        // second time where the scheduler gives the probe its CPU back while the worker still
        // holds the lock, so that the probe sleeps on it (a voluntary switch): between one and
        // two per drain. A CI run counted 1.81 against remote's 0.17.
        let split = |name: &str| {
            let v = read_json(&dir.path().join(format!("{name}.json")));
            let p = &v["probe_preemptions"];
            format!("{} involuntary + {} voluntary", p["count"], p["voluntary"])
        };
        assert!(
            queue >= remote + 0.5 && queue <= remote + 2.5,
            "probe preemptions per drain: queue {queue:.2} ({}), remote {remote:.2} ({}): \
             expected one to two more per drain in queue mode",
            split("queue-counter"),
            split("remote-counter")
        );
        // Fenced mode interrupts the probe (the fence's IPI) but never preempts it: no more
        // than remote mode, well short of queue mode.
        assert!(
            fenced <= remote + 0.3 && queue >= fenced + 0.5,
            "probe preemptions per drain: fenced {fenced:.2}, remote {remote:.2}, queue \
             {queue:.2}: expected fenced about as remote"
        );
    }
    // How the requester's flags were settled: a busy owner (the default run's probe) answers
    // some; an idle one (`fenced-idle-*`, one local operation per 200 us) leaves the requester
    // to fence its CPU.
    let flags = |name: &str| {
        let v = read_json(&dir.path().join(format!("{name}.json")));
        let r = &v["requester"];
        (
            r["flags_answered"].as_u64().unwrap(),
            r["flags_fenced"].as_u64().unwrap(),
        )
    };
    let (busy, idle) = (flags("fenced-counter"), flags("fenced-idle-counter"));
    assert!(busy.0 > 0, "the busy owner answered no flag: {busy:?}");
    assert!(idle.1 > 0, "no fence with an idle owner: {idle:?}");
    // The same idle owner polling its binding at every turn (`fenced-poll-*`, issue 34)
    // answers them from its loop: more answers and fewer fences than without the poll.
    let polling = flags("fenced-poll-counter");
    assert!(
        polling.0 > idle.0 && polling.1 < idle.1,
        "(answered, fenced): idle owner {idle:?}, polling owner {polling:?}"
    );
    assert_eq!(
        flags("remote-counter"),
        (0, 0),
        "remote mode raises no flag"
    );
    // Every mode reports the owner's cost: the probe's own local operation, timed.
    for name in ["queue-counter", "remote-counter", "fenced-counter"] {
        let row = rows.iter().find(|r| r["name"] == name).unwrap();
        let ns = row["local_op_ns"].as_f64();
        assert!(ns.is_some_and(|ns| ns > 0.0), "{name}: local_op_ns {ns:?}");
    }
}
