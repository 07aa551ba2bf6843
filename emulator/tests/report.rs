//! `qpw-emu report` on the real tools' files (recorded from rt-tests 2.4), on a results folder
//! with its `summary.json`, and on bad input: a key that is not a finite latency or is absurdly
//! large must be a clear error that names the file and the key, never a loop.

use std::path::{Path, PathBuf};

use assert_cmd::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rt-tests-2.4")
        .join(name)
}

fn report(files: &[PathBuf], out: &Path) -> std::process::Output {
    Command::cargo_bin("qpw-emu")
        .expect("the qpw-emu binary is built")
        .arg("report")
        .args(files)
        .arg("--out")
        .arg(out)
        .timeout(std::time::Duration::from_secs(30))
        .output()
        .expect("qpw-emu runs")
}

fn ok_stdout(files: &[PathBuf], out: &Path) -> String {
    let o = report(files, out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn smoke_real_files_table_footnotes_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    // A long name must not push the columns out of line.
    let long = dir
        .path()
        .join("a-rather-long-file-name-from-some-ci-job.json");
    std::fs::copy(fixture("ct-rteval.json"), &long).unwrap();
    let files = [
        fixture("oslat-c1-q.json"),
        fixture("ct-overflow.json"),
        long,
    ];
    let text = ok_stdout(&files, dir.path());
    let rows: Vec<&str> = text.lines().filter(|l| l.contains(" | ")).collect();
    assert_eq!(rows.len(), 1 + 1 + 2 + 2, "{text}");
    let bar = rows[0].find(" | ").unwrap();
    assert!(rows.iter().all(|r| r.find(" | ") == Some(bar)), "{text}");
    // cyclictest's overflows hold the tail: lower bounds, not a bucket's edge.
    let overflow_row = rows.iter().find(|r| r.starts_with("ct-overflow")).unwrap();
    assert!(overflow_row.contains(">=20"), "{overflow_row}");
    // Samples per second for every real file (cyclictest's from its recorded -i).
    for r in &rows[1..] {
        // Counted from the bar: a file of several CPUs names its rows `<file> cpu<N>`.
        let left: Vec<&str> = r[..r.find(" | ").unwrap()].split_whitespace().collect();
        let per_s = left[left.len() - 4];
        assert_ne!(per_s, "-", "{r}");
    }
    assert!(
        text.contains("(key k holds [k, k+1) us: a lower edge)"),
        "{text}"
    );
    assert!(text.contains("whose keys are bucket upper edges"), "{text}");
    assert!(text.contains("10 x the smallest median"), "{text}");
    for f in [
        "report-oslat-hist.svg",
        "report-oslat-ccdf.svg",
        "report-cyclictest-hist.svg",
        "report-cyclictest-ccdf.svg",
    ] {
        let svg = std::fs::read_to_string(dir.path().join(f)).unwrap();
        assert!(svg.contains("<path"), "{f}: no max marker");
    }
    // The 2274 us max of ct-overflow lies past its 20 us histogram: the axis reaches it.
    let ccdf = std::fs::read_to_string(dir.path().join("report-cyclictest-ccdf.svg")).unwrap();
    assert!(ccdf.contains(">10ms<") && ccdf.contains("stroke-dasharray"));
}

#[test]
fn summary_json_of_a_run_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("summary.json"),
        r#"{"file_version": 1, "tool": "qpw-emu run", "rows": []}"#,
    )
    .unwrap();
    let files = [dir.path().join("summary.json"), fixture("oslat-c1-q.json")];
    let text = ok_stdout(&files, dir.path());
    assert!(text.contains("skipped"), "{text}");
    assert!(text.contains("oslat-c1-q"), "{text}");
}

/// Writes `fixture` with its first histogram key replaced by `key`, and reports on it.
fn with_key(dir: &Path, fixture_name: &str, old: &str, key: &str) -> (String, PathBuf) {
    let text = std::fs::read_to_string(fixture(fixture_name)).unwrap();
    let changed = text.replacen(old, &format!("\"{key}\":"), 1);
    assert_ne!(text, changed);
    let path = dir.join("crafted.json");
    std::fs::write(&path, changed).unwrap();
    let o = report(std::slice::from_ref(&path), dir);
    assert!(!o.status.success(), "{key}: should fail");
    (String::from_utf8_lossy(&o.stderr).into_owned(), path)
}

#[test]
fn non_finite_huge_negative_and_text_keys_are_clear_errors() {
    for key in ["inf", "-inf", "NaN", "1e308", "1e10", "-5", "abc", ""] {
        for (file, old) in [("oslat-c1-q.json", "\"1\":"), ("ct-rteval.json", "\"7\":")] {
            let dir = tempfile::tempdir().unwrap();
            let (err, path) = with_key(dir.path(), file, old, key);
            assert!(err.starts_with("Error: "), "{key}: {err}");
            assert!(err.contains(&path.display().to_string()), "{err}");
            assert!(err.contains(&format!("histogram key `{key}`")), "{err}");
            assert!(err.contains("0-1e9"), "{err}");
        }
    }
}

#[test]
fn counts_that_do_not_add_up_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixture("ct-overflow.json")).unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(&path, text.replacen("\"cycles\": 1000", "\"cycles\": 3", 1)).unwrap();
    let o = report(std::slice::from_ref(&path), dir.path());
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("more than its 3 cycles"), "{err}");
    // Not JSON, and JSON that is no result.
    std::fs::write(&path, "{ nope").unwrap();
    let err = String::from_utf8_lossy(&report(std::slice::from_ref(&path), dir.path()).stderr)
        .into_owned();
    assert!(err.contains("is not JSON"), "{err}");
    std::fs::write(&path, "{\"a\": 1}").unwrap();
    let err = String::from_utf8_lossy(&report(std::slice::from_ref(&path), dir.path()).stderr)
        .into_owned();
    assert!(err.contains("not an oslat or cyclictest result"), "{err}");
}

#[test]
fn threshold_is_checked_and_applied() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::cargo_bin("qpw-emu")
        .unwrap()
        .args(["report", "--threshold", "0"])
        .arg(fixture("ct-q.txt"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("--threshold 0"));
    let o = Command::cargo_bin("qpw-emu")
        .unwrap()
        .args(["report", "--threshold", "100", "--out"])
        .arg(dir.path())
        .arg(fixture("ct-rteval.json"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("samples above 100 us (--threshold)"),
        "{text}"
    );
}

/// A file of two CPUs gives two rows, named apart (they had the same label; issue 25).
#[test]
fn two_cpus_of_one_file_get_rows_of_their_own() {
    let allowed = qpw_core::allowed_cpus().unwrap();
    if allowed.len() < 2 {
        eprintln!("one CPU: no two-CPU file to make");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("two.json");
    let cpus = format!("{},{}", allowed.first().unwrap(), allowed.last().unwrap());
    let made = Command::cargo_bin("qpw-emu")
        .unwrap()
        .args(["oslat", "-c", &cpus, "-D", "100ms", "-q", "--json"])
        .arg(&file)
        .timeout(std::time::Duration::from_secs(30))
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let out = ok_stdout(&[file], dir.path());
    for cpu in [allowed.first().unwrap(), allowed.last().unwrap()] {
        assert_eq!(
            out.lines()
                .filter(|l| l.starts_with(&format!("two cpu{cpu} ")))
                .count(),
            1,
            "{out}"
        );
    }
}
