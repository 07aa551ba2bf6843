//! Golden-text tests: our `oslat` and `cyclictest` print the same lines, fields and order as
//! rt-tests 2.4's, recorded into `tests/fixtures/rt-tests-2.4/` with the command lines below.
//!
//! Each line is compared *field by field*: every number becomes `N` and spaces go (tabs stay,
//! they separate columns), so `T: 0 (13165) P:80 ... Max:     285` and ours compare equal
//! when they have the same fields in the same order. Our own lines (`# qpw-emu ...`) are left
//! out: they come after the tool's. The `T:` lines are also held to cyclictest's exact
//! `printf` widths, and the JSON to the real files' keys and types.

use std::path::{Path, PathBuf};
use std::process::Output;

use assert_cmd::Command;
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rt-tests-2.4")
        .join(name)
}

fn read_fixture(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).expect("the fixture is in the repository")
}

fn emu(line: &str) -> Output {
    Command::cargo_bin("qpw-emu")
        .expect("the qpw-emu binary is built")
        .args(line.split(' '))
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .expect("qpw-emu runs")
}

fn stdout_of(line: &str) -> String {
    let out = emu(line);
    assert!(
        out.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// A line reduced to its fields: numbers become `N`, spaces go.
fn shape(line: &str) -> String {
    let mut out = String::new();
    let mut in_number = false;
    for c in line.chars() {
        if c.is_ascii_digit() || (in_number && c == '.') {
            if !in_number {
                out.push('N');
                in_number = true;
            }
            continue;
        }
        in_number = false;
        if c != ' ' {
            out.push(c);
        }
    }
    out
}

/// The tool's lines of an output (ours left out), as shapes; runs of histogram rows of `-z`
/// (whose number depends on the data) collapse into one.
fn shapes(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with("# qpw-emu"))
        .map(shape)
        .map(|s| {
            // The overflows' cycle numbers (and whether there are any) depend on the data.
            if s.starts_with("#ThreadN:") {
                "#ThreadN:".to_string()
            } else {
                s
            }
        })
        .collect();
    v.dedup_by(|a, b| {
        let bucket = |s: &str| s.starts_with("N(us):") || s == "...";
        bucket(a) && bucket(b) && !a.contains("including") && !b.contains("including")
    });
    while v.last().is_some_and(String::is_empty) {
        v.pop();
    }
    v
}

/// Whether this process may hold `/dev/cpu_dma_latency` (root, or write access to it): the
/// fixtures were recorded as root, where cyclictest prints that it holds it.
fn dma_latency_writable() -> bool {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency")
        .is_ok()
}

fn assert_same_lines(ours: &str, real: &str, what: &str) {
    // An ordinary user cannot hold it, so neither tool would print that line.
    let without_dma = |text: &str| -> String {
        if dma_latency_writable() {
            return text.to_string();
        }
        text.lines()
            .filter(|l| !l.starts_with("# /dev/cpu_dma_latency set to"))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let (a, b) = (shapes(&without_dma(ours)), shapes(&without_dma(real)));
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(
            x,
            y,
            "{what}: line {} differs\nours:\n{ours}\nreal:\n{real}",
            i + 1
        );
    }
    assert_eq!(
        a.len(),
        b.len(),
        "{what}: {} lines, real {}\nours:\n{ours}\nreal:\n{real}",
        a.len(),
        b.len()
    );
}

#[test]
fn shape_keeps_fields_and_drops_numbers_and_padding() {
    assert_eq!(
        shape("T: 0 (13165) P:80 I:1000 C:   1000 Min:     13 Act:   34"),
        "T:N(N)P:NI:NC:NMin:NAct:N"
    );
    assert_eq!(shape("    001 (us):\t 39620298"), "N(us):\tN");
    assert_eq!(shape("     Average:\t 1.001 (us)"), "Average:\tN(us)");
    // A field renamed or moved is a difference.
    assert_ne!(shape("T: 0 (cpu   1) P:80"), shape("T: 0 (13165) P:80"));
}

#[test]
fn oslat_quiet_summary() {
    let ours = stdout_of("oslat -c 1 -D 200ms -q");
    assert_same_lines(&ours, &read_fixture("oslat-c1-q.txt"), "oslat -q");
    assert!(ours.starts_with("oslat V 2.40\n"));
    assert!(ours.contains("Counter Freq:\t "), "{ours}");
    assert!(ours.contains(" (Mhz)\n"), "oslat writes Mhz: {ours}");
}

#[test]
fn oslat_header_and_two_cpus() {
    let ours = stdout_of("oslat -c 0-1 -D 1");
    assert_same_lines(&ours, &read_fixture("oslat-c01.txt"), "oslat -c 0-1");
}

#[test]
fn oslat_zero_omit_and_bucket_count() {
    let ours = stdout_of("oslat -c 1 -D 200ms -z -q -b 64");
    assert_same_lines(&ours, &read_fixture("oslat-z-b64.txt"), "oslat -z -b 64");
    assert!(
        ours.contains("064 (us):"),
        "the 64th bucket is the last: {ours}"
    );
}

#[test]
fn oslat_bias() {
    let ours = stdout_of("oslat -c 1 -D 200ms -B -q");
    assert_same_lines(&ours, &read_fixture("oslat-bias.txt"), "oslat -B");
}

#[test]
fn oslat_trace_threshold_exits_1_with_oslats_message_only() {
    let out = emu("oslat -c 1 -D 10 -T 1 -q --json /tmp/qpw-golden-never.json");
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout, read_fixture("oslat-T.txt"), "no summary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let real = read_fixture("oslat-T.stderr");
    let tail = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !l.starts_with("warning:"))
            .map(|l| shape(l.split_once("Trace").map_or(l, |(_, t)| t)))
            .collect()
    };
    assert_eq!(tail(&stderr), tail(&real), "{stderr}");
    assert!(!Path::new("/tmp/qpw-golden-never.json").exists(), "no JSON");
}

#[test]
fn cyclictest_quiet_summary_line() {
    let ours = stdout_of("cyclictest -q -l 100 -m -p 80 -i 1000 -a 1");
    assert_same_lines(&ours, &read_fixture("ct-q.txt"), "cyclictest -q");
    // cyclictest's printf widths: "T:%2d (%5d) P:%2d I:%ld C:%7lu Min:%7ld Act:%5ld Avg:%5ld Max:%8ld".
    let re = regex_lite::Regex::new(
        r"^T:[ \d]\d \([ \d]{4}\d+\) P:[ \d]\d I:\d+ C:[ \d]{6}\d+ Min:[ \d]{6}\d+ Act:[ \d]{4}\d+ Avg:[ \d]{4}\d+ Max:[ \d]{7}\d+$",
    )
    .unwrap();
    for text in [ours.as_str(), &read_fixture("ct-q.txt")] {
        let t = text.lines().find(|l| l.starts_with("T:")).unwrap();
        assert!(re.is_match(t), "{t}");
    }
}

#[test]
fn cyclictest_nsecs() {
    let ours = stdout_of("cyclictest -q -l 100 -N -p 80 -i 1000");
    assert_same_lines(&ours, &read_fixture("ct-nsecs.txt"), "cyclictest -N");
}

#[test]
fn cyclictest_rteval_histogram() {
    let ours = stdout_of("cyclictest -i100 -qmu -h 200 -p95 -t2 -a0-1 -D 1");
    assert_same_lines(&ours, &read_fixture("ct-rteval.txt"), "rteval's line");
}

#[test]
fn cyclictest_osadl_histogram() {
    let ours = stdout_of("cyclictest -l500 -m -Sp90 -i200 -h400 -q");
    assert_same_lines(&ours, &read_fixture("ct-osadl.txt"), "OSADL's line");
}

#[test]
fn cyclictest_histofall_column() {
    let ours = stdout_of("cyclictest -q -l 200 -i 1000 -h 20 -H 20 -t 2 -a 0-1 -p 80");
    assert_same_lines(&ours, &read_fixture("ct-histofall.txt"), "cyclictest -H");
}

#[test]
fn cyclictest_breaktrace() {
    let ours = stdout_of("cyclictest -q -D 2 -p 80 -i 1000 -a 1 -b 1");
    assert_same_lines(&ours, &read_fixture("ct-break.txt"), "cyclictest -b");
}

#[test]
fn cyclictest_live_lines() {
    let ours = stdout_of("cyclictest -l 300 -p 80 -i 1000 -t 2");
    let last_block = |s: &str| s.rsplit("\x1b[4A").next().unwrap_or("").to_string();
    let real = read_fixture("ct-live.txt");
    assert_same_lines(&last_block(&ours), &last_block(&real), "live lines");
    if dma_latency_writable() {
        assert!(ours.starts_with("# /dev/cpu_dma_latency set to 0us\npolicy: fifo: loadavg: "));
    } else {
        // An ordinary user: no cpu_dma_latency, and SCHED_FIFO only with an RLIMIT_RTPRIO.
        assert!(ours.starts_with("policy: "), "{ours}");
    }
}

/// The keys (and kinds of value) of a JSON object, nested objects by path; histogram buckets
/// and thread indices left out (their number depends on the data).
fn keys(v: &Value, path: &str, out: &mut Vec<String>) {
    if let Value::Object(map) = v {
        for (k, v) in map {
            if path.ends_with("histogram") {
                continue;
            }
            let k = if path.ends_with("thread") {
                "N"
            } else {
                k.as_str()
            };
            let kind = match v {
                Value::Number(_) => "number",
                Value::String(_) => "string",
                Value::Object(_) => "object",
                _ => "other",
            };
            let p = format!("{path}/{k}");
            out.push(format!("{p}:{kind}"));
            keys(v, &p, out);
        }
    }
}

fn assert_json_like(ours: &Path, real: &str) {
    let ours: Value = serde_json::from_str(&std::fs::read_to_string(ours).unwrap()).unwrap();
    let real: Value = serde_json::from_str(&read_fixture(real)).unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    keys(&ours, "", &mut a);
    keys(&real, "", &mut b);
    for k in &b {
        assert!(a.contains(k), "{k} missing or of another kind in ours");
    }
    assert_eq!(ours["rt_test_version:"], "2.40");
    assert!(ours["qpw_emu_version"].is_string());
}

#[test]
fn json_has_the_real_files_keys_and_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let o = dir.path().join("o.json");
    stdout_of(&format!("oslat -c 1 -D 200ms -q --json={}", o.display()));
    assert_json_like(&o, "oslat-c1-q.json");
    let c = dir.path().join("c.json");
    stdout_of(&format!(
        "cyclictest -i100 -qmu -h 200 -p95 -t2 -a0-1 -l 500 --json={}",
        c.display()
    ));
    assert_json_like(&c, "ct-rteval.json");
    // cyclictest writes "%.2f", oslat "%3lf" (six decimals).
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&c).unwrap()).unwrap();
    let avg = v["thread"]["0"]["avg"].as_f64().unwrap();
    assert_eq!((avg * 100.0).round() / 100.0, avg);
}
