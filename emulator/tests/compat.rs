//! One compatibility test per flag of rt-tests 2.4's `oslat --help` and `cyclictest --help`
//! (recorded in `tests/fixtures/rt-tests-2.4/*-help.txt`): each flag is parsed, and applied
//! with an effect the test can see, or refused with a message that says why. A last test per
//! tool checks that every flag of the real help has its test here.
//!
//! Runs are short (`-D 100ms`, `-l 50`); oslat adds its one-second pre-heat to each.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value;

mod common;

/// A finished run.
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    json: Option<Value>,
    dir: tempfile::TempDir,
}

impl Out {
    fn ok(&self) -> &Self {
        assert_eq!(self.code, Some(0), "stderr: {}", self.stderr);
        self
    }

    fn has(&self, needle: &str) -> &Self {
        assert!(
            self.stdout.contains(needle),
            "`{needle}` not in stdout:\n{}",
            self.stdout
        );
        self
    }

    fn lacks(&self, needle: &str) -> &Self {
        assert!(
            !self.stdout.contains(needle),
            "`{needle}` in stdout:\n{}",
            self.stdout
        );
        self
    }

    fn refused(&self, needle: &str) -> &Self {
        assert_ne!(self.code, Some(0), "should be refused");
        assert!(self.stderr.contains(needle), "{}", self.stderr);
        self
    }

    fn json(&self) -> &Value {
        self.json.as_ref().expect("the run wrote its JSON")
    }

    fn thread(&self, i: usize) -> &Value {
        &self.json()["thread"][i.to_string()]
    }

    /// The `T:` lines.
    fn t_lines(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|l| l.starts_with("T:"))
            .collect()
    }
}

/// Runs `qpw-emu` with `line` split at spaces; `{dir}` becomes a fresh directory, and
/// `--json={dir}/out.json` is read back when present.
fn run(line: &str) -> Out {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let args: Vec<String> = line.split(' ').map(|a| a.replace("{dir}", &d)).collect();
    let o = Command::cargo_bin("qpw-emu")
        .expect("the qpw-emu binary is built")
        .args(&args)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .expect("qpw-emu runs");
    let json_path = dir.path().join("out.json");
    let json = std::fs::read_to_string(&json_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    Out {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        json,
        dir,
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rt-tests-2.4")
        .join(name)
}

/// The flags a help text lists (`-b`, `--bucket-size`, ...): those in its option column (the
/// first 27 columns, tabs expanded), not the ones its descriptions mention.
fn help_flags(name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    let re = regex_lite::Regex::new(r"(?:^|[\s,\[])(--?[A-Za-z][A-Za-z_-]*)").unwrap();
    let mut flags = Vec::new();
    for line in text.lines() {
        let mut col = String::new();
        for c in line.chars() {
            if c == '\t' {
                col.push_str(&" ".repeat(8 - col.len() % 8));
            } else {
                col.push(c);
            }
        }
        let head: String = col.chars().take(27).collect();
        for c in re.captures_iter(&head) {
            flags.push(c[1].to_string());
        }
    }
    flags.sort();
    flags.dedup();
    flags
}

fn assert_all_covered(help: &str, tool: &str) {
    let source =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat.rs"))
            .unwrap();
    let marker = format!("// {tool} flag:");
    let named: Vec<&str> = source
        .lines()
        .filter_map(|l| l.trim().strip_prefix(marker.as_str()))
        .flat_map(str::split_whitespace)
        .collect();
    let flags = help_flags(help);
    assert!(flags.len() >= 14, "the help lists {flags:?}");
    for f in flags {
        assert!(
            named.contains(&f.as_str()),
            "no compatibility test for {tool} {f}"
        );
    }
}

// ---------------------------------------------------------------- oslat

#[test]
fn oslat_every_help_flag_has_a_test() {
    assert_all_covered("oslat-help.txt", "oslat");
}

#[test]
fn oslat_bucket_size() {
    // oslat flag: -b --bucket-size (4-1024, as oslat's help says)
    run("oslat -c 1 -D 100ms -q -b 4")
        .ok()
        .has("004 (us):")
        .lacks("005 (us):");
    run("oslat -c 1 -D 100ms -q --bucket-size 1024")
        .ok()
        .has("1024 (us):");
    run("oslat -b 1025").refused("4-1024");
}

#[test]
fn oslat_bias() {
    // oslat flag: -B --bias
    let o = run("oslat -c 1 -D 100ms -q -B");
    o.ok().has("Global bias set to ");
}

#[test]
fn oslat_cpu_list() {
    // oslat flag: -c --cpu-list (default: all CPUs)
    run("oslat -c 1 -D 100ms -q")
        .ok()
        .has("        Core:\t 1\n");
    let all = run("oslat -D 100ms -q");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let core = all
        .ok()
        .stdout
        .lines()
        .find(|l| l.contains("Core:"))
        .unwrap()
        .to_string();
    assert_eq!(core.split_whitespace().count() - 1, cpus, "{core}");
}

#[test]
fn oslat_cpu_main_thread() {
    // oslat flag: -C --cpu-main-thread
    run("oslat -c 1 -D 100ms -C 0")
        .ok()
        .has("CPU for main thread: \t0\n");
    run("oslat -C 4095").refused("--cpu-main-thread 4095");
}

#[test]
fn oslat_duration() {
    // oslat flag: -D --duration (default 1 s, as oslat)
    // The setting as the run took it, and a probe that measured for about that long, not a
    // fraction of it. No upper bound: on a busy machine the main thread that ends the window
    // and the probe that sees the end may both wake late (1.6 and 2.4 s beside stress-ng).
    let o = run("oslat -c 1 -D 300ms --json={dir}/out.json");
    let d = o.ok().has("Total runtime: \t\t0.300 seconds").thread(0)["duration"]
        .as_f64()
        .unwrap();
    assert!(d >= 0.2, "{d}");
    run("oslat -c 1").ok().has("Total runtime: \t\t1 seconds");
}

#[test]
fn oslat_json() {
    // oslat flag: --json
    let o = run("oslat -c 1 -D 100ms -q --json={dir}/out.json");
    assert_eq!(o.ok().json()["rt_test_version:"], "2.40");
    run("oslat -c 1 -D 100ms --json=/nonexistent/x.json").refused("does not exist");
}

#[test]
fn oslat_rtprio() {
    // oslat flag: -f --rtprio
    run("oslat -c 1 -D 100ms -f 10")
        .ok()
        .has("Thread priority: \tSCHED_FIFO:10");
    run("oslat -f 0").refused("1-99");
}

#[test]
fn oslat_workload_and_its_memory() {
    // oslat flag: -w --workload (no, memmove; ours are --drain-workload)
    // oslat flag: -m --workload-mem
    run("oslat -c 1 -D 100ms -w memmove -m 4K")
        .ok()
        .has("Workload: \t\tmemmove\n")
        .has("Workload mem: \t\t4 (KiB)\n");
    run("oslat -c 1 -D 100ms --workload no")
        .ok()
        .has("Workload: \t\tno\n");
    run("oslat -m 3X").refused("4K");
}

#[test]
fn oslat_quiet() {
    // oslat flag: -q --quiet
    run("oslat -c 1 -D 100ms -q")
        .ok()
        .has("oslat V 2.40\n")
        .lacks("Pre-heat")
        .lacks("Total runtime");
}

#[test]
fn oslat_single_preheat() {
    // oslat flag: -s --single-preheat
    run("oslat -D 100ms -s").ok().has("Preheat cores: \t\t1\n");
}

#[test]
fn oslat_trace_threshold() {
    // oslat flag: -T --trace-threshold
    let o = run("oslat -c 1 -D 5 -T 1 -q");
    assert_eq!(o.code, Some(1));
    assert!(
        o.stderr
            .contains("Trace threshold (1 us) triggered on cpu 1"),
        "{}",
        o.stderr
    );
    o.lacks("Maximum:");
    // oslat arms the trigger after the pre-heat, when it says `Test starts...`: without -q the
    // trigger comes after that line (ours used to fire before it was printed; issue 25).
    let o = run("oslat -c 1 -D 5 -T 1");
    assert_eq!(o.code, Some(1));
    o.has("Pre-heat for 1 seconds...\n")
        .has("Test starts...\n")
        .lacks("Test completed.");
}

#[test]
fn oslat_version() {
    // oslat flag: -v --version
    run("oslat -v").ok().has("oslat V 2.40\n").lacks("Core:");
}

#[test]
fn oslat_zero_omit() {
    // oslat flag: -z --zero-omit
    run("oslat -c 1 -D 100ms -q -z -b 1024")
        .ok()
        .has("    ...\n");
}

#[test]
fn oslat_help() {
    // oslat flag: -h --help
    run("oslat -h").ok().has("--bucket-size");
}

// ---------------------------------------------------------------- cyclictest

#[test]
fn cyclictest_every_help_flag_has_a_test() {
    assert_all_covered("cyclictest-help.txt", "cyclictest");
}

#[test]
fn cyclictest_affinity() {
    // cyclictest flag: -a --affinity ([CPUSET]: round robin; without: all CPUs)
    let o = run("cyclictest -l 20 -q -a 1 -t 2 --json={dir}/out.json");
    o.ok();
    assert_eq!(o.thread(0)["cpu"], 1);
    assert_eq!(o.thread(1)["cpu"], 1);
    // `-a -t`: -a takes no value from the next flag.
    let o = run("cyclictest -l 20 -q -a -t --json={dir}/out.json");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(o.ok().json()["num_threads"], cpus);
}

#[test]
fn cyclictest_aligned() {
    // cyclictest flag: -A --aligned
    let o = run("cyclictest -l 20 -q -t 2 -A 100");
    assert_eq!(o.ok().t_lines().len(), 2);
}

#[test]
fn cyclictest_breaktrace() {
    // cyclictest flag: -b --breaktrace
    run("cyclictest -q -D 5 -b 1")
        .ok()
        .has("# Thread Ids:")
        .has("# Break value: ");
}

/// `-l` with several threads: the first thread to reach it stops them all, as in cyclictest
/// (its `shutdown`); the others show fewer cycles. Ours ran every thread to -l (issue 25).
#[test]
fn cyclictest_loops_end_every_thread_with_the_first() {
    // Thread 1's interval is 1000 + 500 us (-d's default distance): about 2/3 of thread 0's
    // cycles when thread 0 reaches 150. Which thread gets there first is the scheduler's
    // business on a busy machine (a late wake-up is a lost cycle, not a delayed one): the
    // test asks only that one did and stopped the other (which, as in 2.4, runs on until the
    // main loop has seen the first one done, 10-20 ms: far from 50 cycles more).
    let o = run("cyclictest -l 150 -q -t 2 -i 1000");
    let cycles: Vec<u64> = o
        .ok()
        .t_lines()
        .iter()
        .map(|l| {
            let c = l
                .split("C:")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            c.parse().unwrap()
        })
        .collect();
    assert_eq!(cycles.len(), 2, "{}", o.stdout);
    assert_eq!(
        cycles.iter().filter(|&&c| c == 150).count(),
        1,
        "one thread reached -l and stopped the other: {}",
        o.stdout
    );
    assert!(cycles.iter().all(|&c| c <= 150), "{}", o.stdout);
}

#[test]
fn cyclictest_clock() {
    // cyclictest flag: -c --clock (0 monotonic, 1 realtime)
    assert_eq!(run("cyclictest -l 20 -q -c 1").ok().t_lines().len(), 1);
    run("cyclictest -c 2").refused("0-1");
}

#[test]
fn cyclictest_default_system() {
    // cyclictest flag: --default-system
    run("cyclictest -l 20 -q --default-system")
        .ok()
        .lacks("cpu_dma_latency");
}

#[test]
fn cyclictest_distance() {
    // cyclictest flag: -d --distance
    let o = run("cyclictest -l 20 -q -t 2 -d 300");
    assert!(o.ok().t_lines()[1].contains(" I:1300 "), "{}", o.stdout);
}

#[test]
fn cyclictest_duration() {
    // cyclictest flag: -D --duration (0 or none: until stopped)
    // What -D decides, whatever the machine's load: the run takes it as 0.3 s, ends by itself,
    // not before 300 ms (a bound the clock keeps, not a measurement), and with at most about
    // 300 wake-ups at 1 ms (deadlines are absolute: a late wake-up is not made up by extra
    // ones). How many of them a busy machine grants a SCHED_OTHER thread is not asserted.
    let start = std::time::Instant::now();
    let o = run("cyclictest -D 300ms -q -i 1000 --json={dir}/out.json");
    let took = start.elapsed();
    assert_eq!(o.ok().json()["settings"]["duration_s"], 0.3);
    let c = o.thread(0)["cycles"].as_u64().unwrap();
    assert!((1..=320).contains(&c), "{c}");
    assert!(
        took >= std::time::Duration::from_millis(300),
        "a 300 ms run ended after {took:?}"
    );
}

#[test]
fn cyclictest_fifo() {
    // cyclictest flag: -F --fifo
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ct.fifo");
    let reader_path = path.clone();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let done = done.clone();
        std::thread::spawn(move || {
            // Wait for the pipe, then read one round of status lines. The pipe is opened
            // without blocking, so that a reader that comes late (a busy machine: the run may
            // take seconds to start, and ends by removing its pipe) never waits for a writer
            // that will not come; it reads until a whole line came or the run has ended.
            use std::io::Read as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut got = Vec::new();
            let mut pipe = None;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                if pipe.is_none() {
                    pipe = std::fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(libc::O_NONBLOCK)
                        .open(&reader_path)
                        .ok();
                }
                if let Some(p) = &mut pipe {
                    let mut buf = [0u8; 4096];
                    if let Ok(n) = p.read(&mut buf) {
                        got.extend_from_slice(&buf[..n]);
                    }
                    if got.contains(&b'\n') {
                        break;
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            String::from_utf8_lossy(&got).into_owned()
        })
    };
    run(&format!("cyclictest -D 2 -q -F {}", path.display())).ok();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let got = reader.join().unwrap();
    assert!(got.starts_with("T: 0 ("), "{got}");
    assert!(!path.exists(), "the pipe is removed at the end");
}

#[test]
fn cyclictest_histogram() {
    // cyclictest flag: -h --histogram
    let o = run("cyclictest -l 50 -q -h 30");
    o.ok()
        .has("# Histogram\n")
        .has("000029 ")
        .lacks("000030 ")
        .lacks("T: 0");
}

#[test]
fn cyclictest_histofall() {
    // cyclictest flag: -H --histofall
    let o = run("cyclictest -l 50 -q -H 30 -t 2");
    let row = o
        .ok()
        .stdout
        .lines()
        .find(|l| l.starts_with("000000 "))
        .unwrap()
        .to_string();
    assert_eq!(row.split('\t').count(), 3, "two threads and all: {row}");
}

#[test]
fn cyclictest_histfile() {
    // cyclictest flag: --histfile
    let o = run("cyclictest -l 50 -q -h 30 --histfile={dir}/hist.txt");
    o.ok().lacks("# Histogram");
    let text = std::fs::read_to_string(o.dir.path().join("hist.txt")).unwrap();
    assert!(text.starts_with("# Histogram\n000000 "), "{text}");
}

#[test]
fn cyclictest_interval() {
    // cyclictest flag: -i --interval
    let o = run("cyclictest -l 20 -q -i 250");
    assert!(o.ok().t_lines()[0].contains(" I:250 "), "{}", o.stdout);
}

#[test]
fn cyclictest_json() {
    // cyclictest flag: --json
    let o = run("cyclictest -l 20 -q --json={dir}/out.json");
    assert_eq!(o.ok().thread(0)["cycles"], 20);
}

#[test]
fn cyclictest_laptop() {
    // cyclictest flag: --laptop
    let o = run("cyclictest -l 20 -q --laptop");
    o.ok().lacks("cpu_dma_latency");
    assert!(o.stderr.contains("save battery"), "{}", o.stderr);
}

#[test]
fn cyclictest_latency() {
    // cyclictest flag: --latency
    let o = run("cyclictest -l 20 -q --latency 5");
    let o = o.ok();
    // As cyclictest, the line only when the file could be held (root, or write access).
    let writable = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency")
        .is_ok();
    if writable {
        o.has("# /dev/cpu_dma_latency set to 5us");
    } else {
        o.lacks("# /dev/cpu_dma_latency set to");
    }
}

#[test]
fn cyclictest_loops() {
    // cyclictest flag: -l --loops
    let o = run("cyclictest -l 37 -q");
    assert!(o.ok().t_lines()[0].contains(" C:     37 "), "{}", o.stdout);
}

#[test]
fn cyclictest_mainaffinity() {
    // cyclictest flag: --mainaffinity
    run("cyclictest -l 20 -q --mainaffinity 0").ok();
    run("cyclictest --mainaffinity 4095").refused("--mainaffinity 4095");
}

#[test]
fn cyclictest_mlockall() {
    // cyclictest flag: -m --mlockall
    let locked = run("cyclictest -l 20 -m --json={dir}/out.json");
    let warned = |o: &Out| {
        o.json()["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("mlockall not asked for"))
    };
    assert!(!warned(locked.ok()));
    let unlocked = run("cyclictest -l 20 --json={dir}/out.json");
    assert!(warned(unlocked.ok()));
}

#[test]
fn cyclictest_refresh_on_max() {
    // cyclictest flag: -M --refresh_on_max
    let o = run("cyclictest -l 100 -M");
    assert!(!o.ok().t_lines().is_empty());
}

#[test]
fn cyclictest_nsecs() {
    // cyclictest flag: -N --nsecs
    let o = run("cyclictest -l 20 -q -N --json={dir}/out.json");
    assert_eq!(o.ok().json()["resolution_in_ns"], 1);
    // Nanoseconds: a wake-up is late by thousands of them.
    assert!(o.thread(0)["min"].as_u64().unwrap() >= 100);
}

#[test]
fn cyclictest_oscope() {
    // cyclictest flag: -o --oscope (with -v)
    // Exactly 4: the main loop reads the counts before it prints, so the print that ends the
    // run has seen all 40 samples (2.4 reads them after; this test once saw 3 lines in CI).
    let o = run("cyclictest -l 40 -q -v -o 10");
    let values = o
        .ok()
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("0:"))
        .count();
    assert_eq!(values, 4, "{}", o.stdout);
    run("cyclictest -o 10").refused("-v");
}

#[test]
fn cyclictest_priority() {
    // cyclictest flag: -p --priority
    let o = run("cyclictest -l 20 -q -p 80");
    assert!(o.ok().t_lines()[0].contains(" P:80 "), "{}", o.stdout);
}

#[test]
fn cyclictest_policy() {
    // cyclictest flag: --policy
    let o = run("cyclictest -l 20 --policy rr -p 10");
    o.ok().has("policy: rr: loadavg");
    run("cyclictest --policy deadline").refused("fifo, rr");
}

#[test]
fn cyclictest_priospread() {
    // cyclictest flag: --priospread
    let o = run("cyclictest -l 20 -q -p 80 -t 2 --priospread");
    let lines = o.ok().t_lines();
    assert!(
        lines[0].contains(" P:80 ") && lines[1].contains(" P:79 "),
        "{lines:?}"
    );
}

#[test]
fn cyclictest_quiet() {
    // cyclictest flag: -q --quiet
    let o = run("cyclictest -l 20 -q");
    o.ok().lacks("policy:").lacks("\x1b[");
    assert_eq!(o.t_lines().len(), 1);
}

#[test]
fn cyclictest_relative() {
    // cyclictest flag: -r --relative
    assert_eq!(run("cyclictest -l 20 -q -r").ok().t_lines().len(), 1);
}

#[test]
fn cyclictest_resolution() {
    // cyclictest flag: -R --resolution (with --dbg_cyclictest, the readings)
    // cyclictest flag: --dbg_cyclictest
    let o = run("cyclictest -l 20 -q -R -v --dbg_cyclictest");
    o.ok();
    assert!(
        o.stderr.contains("measured clock resolution"),
        "{}",
        o.stderr
    );
}

#[test]
fn cyclictest_secaligned() {
    // cyclictest flag: --secaligned
    assert_eq!(
        run("cyclictest -l 20 -q --secaligned 50")
            .ok()
            .t_lines()
            .len(),
        1
    );
}

#[test]
fn cyclictest_system() {
    // cyclictest flag: -s --system
    assert_eq!(run("cyclictest -l 20 -q -s").ok().t_lines().len(), 1);
}

#[test]
fn cyclictest_smp() {
    // cyclictest flag: -S --smp
    let o = run("cyclictest -l 20 -q -S --json={dir}/out.json");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(o.ok().json()["num_threads"], cpus);
}

#[test]
fn cyclictest_spike() {
    // cyclictest flag: --spike
    // cyclictest flag: --spike-nodes
    let o = run("cyclictest -l 30 -q --spike 1 --spike-nodes 5");
    o.ok().has("spikes = 30\n");
    let listed = o.stdout.lines().filter(|l| l.contains("Spike:")).count();
    assert_eq!(listed, 5);
}

#[test]
fn cyclictest_smi() {
    // cyclictest flag: --smi (refused: no MSR access)
    run("cyclictest --smi").refused("not supported");
}

#[test]
fn cyclictest_threads() {
    // cyclictest flag: -t --threads
    assert_eq!(run("cyclictest -l 20 -q -t 3").ok().t_lines().len(), 3);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(run("cyclictest -l 20 -q -t").ok().t_lines().len(), cpus);
}

#[test]
fn cyclictest_tracemark() {
    // cyclictest flag: --tracemark (with -b)
    run("cyclictest -q -D 5 -b 1 --tracemark")
        .ok()
        .has("# Break thread: ");
}

#[test]
fn cyclictest_unbuffered() {
    // cyclictest flag: -u --unbuffered
    assert_eq!(run("cyclictest -l 20 -q -u").ok().t_lines().len(), 1);
}

#[test]
fn cyclictest_verbose() {
    // cyclictest flag: -v --verbose
    let o = run("cyclictest -l 20 -q -v");
    let values = o
        .ok()
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("0:"))
        .count();
    assert_eq!(values, 20, "{}", o.stdout);
}

/// With several threads and `-l`, the run ends at the main loop's first look after a thread
/// reached its count (2.4's `allstopped`): that thread has printed all of its samples,
/// numbered 0 to N-1, and every thread's samples run from 0 without a gap. (Issue 31 saw 3990
/// of 4000 for one thread once; side by side with 2.4 here both cut the slower thread alike,
/// at 685-1000 of 1000 under `stress-ng --cpu 2`, and the thread that ended the run had all.)
#[test]
fn cyclictest_verbose_threads_print_every_sample_up_to_the_end() {
    let o = run("cyclictest -l 300 -t 2 -d 0 -i 500 -v");
    let mut by_thread: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    for l in o.ok().stdout.lines() {
        let f: Vec<&str> = l.split(':').map(str::trim).collect();
        if let [t, c, _] = f[..] {
            if let (Ok(t), Ok(c)) = (t.parse(), c.parse()) {
                by_thread.entry(t).or_default().push(c);
            }
        }
    }
    assert_eq!(by_thread.len(), 2, "{}", o.stdout);
    for (t, cycles) in &by_thread {
        let expect: Vec<u64> = (0..cycles.len() as u64).collect();
        assert_eq!(
            cycles,
            &expect,
            "thread {t}'s samples are not 0..{}",
            cycles.len()
        );
    }
    assert!(
        by_thread.values().any(|c| c.len() == 300),
        "no thread printed all 300 samples: {:?}",
        by_thread.values().map(Vec::len).collect::<Vec<_>>()
    );
}

/// A thread that reaches `-l` ends alone; the others run on until the main loop has seen it
/// (2.4: print, count the finished threads, sleep 10 ms, stop): so a thread a few cycles
/// behind finishes too. Here thread 1 (1.1 ms) reaches 50 at 55 ms, 5 ms after thread 0:
/// 2.4 showed `C: 50` for both; ours stopped every thread at the first one's last cycle and
/// showed thread 1 at 43-46 (issue 31, point 4: 3990 of 4000 for `-l4000 -t2 -v`). A cycle
/// lost to a busy machine can leave it short in one run, so up to five are tried.
#[test]
fn cyclictest_loops_let_a_thread_near_the_end_finish() {
    let mut seen = Vec::new();
    for _ in 0..5 {
        let o = run("cyclictest -l 50 -q -t 2 -i 1000 -d 100");
        let cycles: Vec<u64> = o
            .ok()
            .t_lines()
            .iter()
            .filter_map(|l| {
                l.split("C:")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        if cycles == [50, 50] {
            return;
        }
        seen.push(cycles);
    }
    panic!("thread 1 never finished its 50 cycles: {seen:?}");
}

/// oslat `-T` where `trace_marker` cannot be written (an ordinary user here): 2.4's two lines
/// on stderr and exit 1 all the same; only then may our warning about ftrace matter, so it
/// comes after them (issue 43).
#[test]
fn oslat_trace_threshold_without_a_writable_trace_marker() {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_qpw-emu"));
    cmd.args(["oslat", "-c", "1", "-D", "5", "-T", "1"]);
    common::as_nobody(&mut cmd);
    let o = cmd.output().expect("qpw-emu runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("oslat: Trace threshold (1 us) triggered on cpu 1 with "))
        .unwrap_or_else(|| panic!("no trigger line: {stderr}"));
    assert!(lines[at].ends_with(" us!"), "{stderr}");
    assert_eq!(lines.get(at + 1), Some(&"Stopping the test."), "{stderr}");
    let ftrace = lines
        .iter()
        .position(|l| l.contains("ftrace is not available"))
        .unwrap_or_else(|| panic!("no warning about ftrace: {stderr}"));
    assert!(
        ftrace > at + 1,
        "the ftrace warning before 2.4's lines: {stderr}"
    );
}

#[test]
fn cyclictest_posix_timers() {
    // cyclictest flag: -x --posix_timers
    let o = run("cyclictest -l 20 -q -x");
    assert!(o.ok().t_lines()[0].contains(" C:     20 "), "{}", o.stdout);
}

#[test]
fn cyclictest_mlock_and_help() {
    // cyclictest flag: --help
    run("cyclictest --help").ok().has("--histogram");
}
