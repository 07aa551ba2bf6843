//! Our output read by the scripts that read the real tools': the shell pipelines the community
//! uses on cyclictest's summary line, `# Max Latencies:` and `# Histogram Overflows` (OSADL's
//! latency plots, CI jobs), run with `sh` on the real tools' recorded output and on ours; and
//! rteval's and OSADL's command lines, which must run and write what those tools expect.

use std::path::Path;

use assert_cmd::Command;
use serde_json::Value;

fn fixture(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rt-tests-2.4")
        .join(name);
    std::fs::read_to_string(p).expect("the fixture is in the repository")
}

/// Runs `qpw-emu` with `line` (split at spaces); it must succeed. Returns stdout.
fn run(line: &str) -> String {
    let out = Command::cargo_bin("qpw-emu")
        .expect("the qpw-emu binary is built")
        .args(line.split(' '))
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .expect("qpw-emu runs");
    assert!(
        out.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// Pipes `input` through the shell pipeline `script`; returns its trimmed output.
fn pipe(script: &str, input: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sh runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("JSON written")).expect("parses")
}

/// The summary line's last field is the max; `Max:`'s neighbour too.
const SUMMARY_MAX: &str = "awk '$1 == \"T:\" {print $NF}'";
const SUMMARY_MAX_BY_LABEL: &str =
    "awk '/^T:/ {for (i = 1; i < NF; i++) if ($i == \"Max:\") print $(i + 1)}'";
/// OSADL's latency-plot script: the largest of `# Max Latencies:`, zeros stripped.
const OSADL_MAX: &str =
    "grep \"Max Latencies\" | tr \" \" \"\\n\" | sort -n | tail -1 | sed s/^0*//";
/// OSADL's data lines: comments and blank lines out, tabs between fields.
const OSADL_ROWS: &str =
    "grep -v -e \"^#\" -e \"^$\" | tr \" \" \"\\t\" | awk -F'\\t' '{print NF}' | sort -u";
const OSADL_ROW_COUNT: &str = "grep -v -e \"^#\" -e \"^$\" | wc -l";
/// The overflows of every thread, summed.
const OVERFLOWS: &str =
    "awk '/^# Histogram Overflows:/ {for (i = 4; i <= NF; i++) s += $i} END {print s + 0}'";

#[test]
fn the_scripts_read_the_real_tools_output() {
    // The pipelines themselves, on the recorded output: what they give there, they must
    // give on ours.
    assert_eq!(pipe(SUMMARY_MAX, &fixture("ct-q.txt")), "285");
    assert_eq!(pipe(SUMMARY_MAX_BY_LABEL, &fixture("ct-q.txt")), "285");
    assert_eq!(pipe(OSADL_MAX, &fixture("ct-rteval.txt")), "463");
    assert_eq!(pipe(OSADL_ROWS, &fixture("ct-rteval.txt")), "3");
    assert_eq!(pipe(OSADL_ROW_COUNT, &fixture("ct-osadl.txt")), "400");
    assert_eq!(pipe(OVERFLOWS, &fixture("ct-rteval.txt")), "12");
}

#[test]
fn the_summary_line_parses_as_cyclictests() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("ct.json");
    let out = run(&format!(
        "cyclictest -q -l 200 -m -p 80 -i 1000 -a 1 --json={}",
        json.display()
    ));
    let max = read_json(&json)["thread"]["0"]["max"].as_u64().unwrap();
    assert_eq!(pipe(SUMMARY_MAX, &out), max.to_string(), "{out}");
    assert_eq!(pipe(SUMMARY_MAX_BY_LABEL, &out), max.to_string(), "{out}");
}

/// rteval's cyclictest line: `-i100 -qmu -h 3500 -p95 -t2 -a0-1` (here for a second), its
/// output redirected to a file as rteval does, and the JSON.
#[test]
fn rtevals_command_line_runs_and_writes_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("cyclictest.json");
    let out = run(&format!(
        "cyclictest -i100 -qmu -h 3500 -p95 -t2 -a0-1 -D 1 --json={}",
        json.display()
    ));
    let text = dir.path().join("cyclictest.out");
    std::fs::write(&text, &out).unwrap();
    let v = read_json(&json);
    assert_eq!(v["num_threads"], 2);
    let maxima: Vec<u64> = (0..2)
        .map(|i| v["thread"][i.to_string()]["max"].as_u64().unwrap())
        .collect();
    assert_eq!(pipe(OSADL_ROW_COUNT, &out), "3500");
    assert_eq!(
        pipe(OSADL_ROWS, &out),
        "3",
        "index and two threads on every row"
    );
    assert_eq!(
        pipe(OSADL_MAX, &out),
        maxima.iter().max().unwrap().to_string()
    );
    // The overflows are the cycles the histogram does not hold.
    let over: u64 = (0..2)
        .map(|i| {
            let t = &v["thread"][i.to_string()];
            let held: u64 = t["histogram"]
                .as_object()
                .unwrap()
                .values()
                .map(|c| c.as_u64().unwrap())
                .sum();
            t["cycles"].as_u64().unwrap() - held
        })
        .sum();
    assert_eq!(pipe(OVERFLOWS, &out), over.to_string());
    // At most about 10000 wake-ups a second on each thread at 100 us (deadlines are absolute:
    // a late wake-up is not made up by extra ones). At SCHED_FIFO 95 (root) no ordinary
    // thread of a busy machine delays them, so at least a tenth of them come; where the
    // priority is refused (an ordinary user) the threads run SCHED_OTHER, and how many
    // wake-ups a busy machine grants them is not this test's business, only that they woke.
    let sched_other = v["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|w| w.as_str().is_some_and(|w| w.contains("runs SCHED_OTHER")));
    let least = if sched_other { 1 } else { 1000 };
    let cycles = v["thread"]["0"]["cycles"].as_u64().unwrap();
    assert!((least..=11_000).contains(&cycles), "{cycles}");
}

/// OSADL's latency-plot line: `-l... -m -Sp90 -i200 -h400 -q`: one thread per CPU, 400 rows.
#[test]
fn osadls_command_line_runs_and_plots() {
    let out = run("cyclictest -l1000 -m -Sp90 -i200 -h400 -q");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(pipe(OSADL_ROW_COUNT, &out), "400");
    assert_eq!(pipe(OSADL_ROWS, &out), (cpus + 1).to_string());
    let totals = pipe(
        "awk '/^# Total:/ {for (i = 3; i <= NF; i++) print $i + 0}'",
        &out,
    );
    let overflows = pipe(
        "awk '/^# Histogram Overflows:/ {for (i = 4; i <= NF; i++) print $i + 0}'",
        &out,
    );
    // -l1000: the first thread to reach 1000 wake-ups stops them all, as in cyclictest, so
    // one thread's in-range total plus its overflows is 1000 and no thread's is more.
    let per_thread: Vec<u64> = totals
        .lines()
        .zip(overflows.lines())
        .map(|(t, o)| t.parse::<u64>().unwrap() + o.parse::<u64>().unwrap())
        .collect();
    assert_eq!(per_thread.iter().max(), Some(&1000), "{out}");
    assert!(!pipe(OSADL_MAX, &out).is_empty());
}

/// Linaro's cyclictest test definition (test-definitions, `automated/linux/cyclictest`, the
/// version that parses the text): runs `cyclictest -p P -i I -t N -l L | tee log`, then reads the
/// last N lines as the `T:` lines. Our own lines once followed them on stdout, and this parser
/// turned them into `tqpw-emu-min-latency pass p99.99 us` (issue 25); they go to stderr now.
fn linaro_parser(threads: usize) -> String {
    format!(
        "tail -n {threads} | sed 's/T:/T: /' | awk '{{printf(\"t%s-min-latency pass %s us\\n\", \
         $2, $(NF-6))}}; {{printf(\"t%s-avg-latency pass %s us\\n\", $2, $(NF-2))}}; \
         {{printf(\"t%s-max-latency pass %s us\\n\", $2, $NF)}};'"
    )
}

#[test]
fn linaros_parser_reads_our_last_lines_as_t_lines() {
    // Without -p (a SCHED_FIFO priority needs root); the parser does not look at it. Then one
    // thread on the last CPU under the drain load, whose requester line was one of those that
    // broke it.
    let last = qpw_core::allowed_cpus()
        .unwrap()
        .last()
        .unwrap()
        .to_string();
    let plain = "cyclictest -i 1000 -t 2 -l 300".to_string();
    let loaded =
        format!("cyclictest -i 1000 -t 1 -a {last} -l 300 --mode queue --workload counter");
    let mut cases = vec![(plain, 2)];
    if qpw_core::allowed_cpus().unwrap().len() > 1 {
        cases.push((loaded, 1));
    }
    for (line, threads) in cases {
        let stdout = run(&line);
        let parsed = pipe(&linaro_parser(threads), &stdout);
        let lines: Vec<&str> = parsed.lines().collect();
        assert_eq!(
            lines.len(),
            3 * threads,
            "{line}: {parsed}\nfrom:\n{stdout}"
        );
        for (i, l) in lines.iter().enumerate() {
            let f: Vec<&str> = l.split(' ').collect();
            let (t, kind) = (i / 3, ["min", "avg", "max"][i % 3]);
            assert_eq!(f[0], format!("t{t}-{kind}-latency"), "{line}: {parsed}");
            assert_eq!((f[1], f[3]), ("pass", "us"), "{line}: {parsed}");
            assert!(
                f[2].parse::<u64>().is_ok(),
                "{line}: not a latency: {l}\n{stdout}"
            );
        }
    }
}
