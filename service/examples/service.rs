//! A UDP service on qpw-core with a metrics scrape and a Prometheus endpoint, and the
//! comparison of what each mode costs its requests (see the `qpw_service` crate docs).
//!
//! ```text
//! cargo run --release --example service -- compare            # every mode, scrape rates 10-10000/s
//! cargo run --release --example service -- serve --mode remote --scrape-rate 100 --port 9464
//! cargo run --release --example service -- load 127.0.0.1:PORT --rate 2000 -D 10s
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use qpw_service::{duration, plot, run_one, Poll, RunResult, Scrape};

#[derive(Parser)]
#[command(about = "A qpw-core service: serve, load, or compare the modes")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every mode (queue, remote, fenced, auto) at each scrape rate, under the same load:
    /// request latency, the serving thread's context switches per scrape, scrape time, and a
    /// check that the scrapes counted every request once.
    Compare {
        /// Requests per second (1-100000).
        #[arg(long, default_value = "2000")]
        request_rate: f64,
        /// Scrape rates per second, comma-separated (each 1-100000).
        #[arg(long, default_value = "10,100,1000,10000")]
        rates: String,
        /// Modes, comma-separated: queue, remote, fenced, auto.
        #[arg(long, default_value = "queue,remote,fenced,auto")]
        modes: String,
        /// Load per cell: 2s, 500ms, 1m.
        #[arg(short = 'D', long, default_value = "2s")]
        duration: String,
        /// How the scrape reaches the CPUs: work (per-CPU work, queued in queue mode), walk
        /// (the metrics thread takes each lock itself), or cid (the counts kept per
        /// concurrency id, rseq's mm_cid, and the ids used walked).
        #[arg(long, default_value = "work")]
        scrape: Scrape,
        /// How the serving threads wait for requests: busy (spin on the socket, as a service
        /// owning its CPU does) or block (sleep in recv).
        #[arg(long, default_value = "busy")]
        poll: Poll,
        /// Write every figure as JSON here.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// Draw request p99 against scrape rate, per mode, as SVG here.
        #[arg(long)]
        plot: Option<std::path::PathBuf>,
    },
    /// Run the service: servers, periodic scrape, Prometheus endpoint on 127.0.0.1:PORT.
    Serve {
        /// queue, remote, fenced or auto.
        #[arg(long, default_value = "auto")]
        mode: String,
        /// Scrapes per second (0-100000).
        #[arg(long, default_value = "10")]
        scrape_rate: f64,
        /// work, walk or cid.
        #[arg(long, default_value = "work")]
        scrape: Scrape,
        /// busy or block.
        #[arg(long, default_value = "busy")]
        poll: Poll,
        /// The endpoint's port (0: any free one, printed).
        #[arg(long, default_value = "9464")]
        port: u16,
        /// How long to serve (default: until Ctrl-C ends the process).
        #[arg(short = 'D', long)]
        duration: Option<String>,
    },
    /// Send requests at a fixed rate to running servers and print the round trips.
    Load {
        /// The servers' addresses, as `serve` printed them.
        #[arg(required = true)]
        targets: Vec<SocketAddr>,
        /// Requests per second (1-1000000).
        #[arg(long, default_value = "2000")]
        rate: f64,
        /// How long: 10s, 500ms, 1m.
        #[arg(short = 'D', long, default_value = "10s")]
        duration: String,
    },
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Compare {
            request_rate,
            rates,
            modes,
            duration: d,
            scrape,
            poll,
            json,
            plot: plot_path,
        } => compare(
            &Plan::new(request_rate, &rates, &modes, &d, (scrape, poll))?,
            json.as_deref(),
            plot_path.as_deref(),
        ),
        Cmd::Serve {
            mode,
            scrape_rate,
            scrape,
            poll,
            port,
            duration: d,
        } => {
            let d = d.map(|d| duration("--duration", &d)).transpose()?;
            let svc = qpw_service::Service::start(&qpw_service::Config {
                policy: qpw_service::policy(&mode)?,
                scrape_rate,
                scrape,
                poll,
                http_port: Some(port),
            })?;
            println!("{}", svc.describe());
            for (cpu, addr) in svc.serving_cpus().iter().zip(svc.addrs()) {
                println!("serving on cpu {cpu}: udp {addr}");
            }
            if let Some(a) = svc.http_addr() {
                println!("metrics: http://{a}/metrics");
            }
            match d {
                Some(d) => std::thread::sleep(d),
                None => loop {
                    std::thread::sleep(Duration::from_secs(3600));
                },
            }
            let r = svc.stop()?;
            println!(
                "served {}, scraped {} in {} scrapes: {}",
                r.served,
                r.scraped,
                r.scrapes,
                if r.served == r.scraped {
                    "nothing lost"
                } else {
                    "MISMATCH"
                }
            );
            Ok(())
        }
        Cmd::Load {
            targets,
            rate,
            duration: d,
        } => {
            let r = qpw_service::load(&targets, rate, duration("--duration", &d)?, None)?;
            println!(
                "sent {} replied {} (duplicate replies {}, stray datagrams {}); round trip us: \
                 p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.1}",
                r.sent, r.received, r.duplicates, r.stray, r.p50_us, r.p99_us, r.p999_us, r.max_us
            );
            Ok(())
        }
    }
}

/// `compare`'s arguments, checked.
struct Plan {
    request_rate: f64,
    /// Scrapes per second, one cell per rate and mode.
    rates: Vec<f64>,
    modes: Vec<String>,
    /// The load per cell.
    duration: Duration,
    scrape: Scrape,
    poll: Poll,
}

impl Plan {
    /// Each argument within its range, or an error naming it and the range.
    fn new(
        request_rate: f64,
        rates: &str,
        modes: &str,
        duration_arg: &str,
        (scrape, poll): (Scrape, Poll),
    ) -> Result<Self> {
        let duration = duration("--duration", duration_arg)?;
        if !(1.0..=100_000.0).contains(&request_rate) {
            bail!("--request-rate {request_rate}: must be 1 to 100000 per second");
        }
        let rates = rates
            .split(',')
            .map(|r| match r.trim().parse::<f64>() {
                Ok(v) if (1.0..=100_000.0).contains(&v) => Ok(v),
                _ => bail!("--rates {rates}: `{r}` is not a scrape rate of 1 to 100000 per second"),
            })
            .collect::<Result<_>>()?;
        let modes: Vec<String> = modes.split(',').map(|m| m.trim().to_string()).collect();
        for m in &modes {
            qpw_service::policy(m).with_context(|| format!("--modes {}", modes.join(",")))?;
        }
        Ok(Plan {
            request_rate,
            rates,
            modes,
            duration,
            scrape,
            poll,
        })
    }

    fn cells(&self) -> usize {
        self.rates.len() * self.modes.len()
    }
}

/// Every mode at each scrape rate: the plan measured, the table printed, the JSON and the plot
/// written, and an error if any cell's counts disagree.
fn compare(
    plan: &Plan,
    json: Option<&std::path::Path>,
    plot_path: Option<&std::path::Path>,
) -> Result<()> {
    eprintln!(
        "service compare: {} modes x {} scrape rates, {:.1} s each at {} requests/s \
         (about {:.0} s); scrape by {:?}, servers poll {:?}",
        plan.modes.len(),
        plan.rates.len(),
        plan.duration.as_secs_f64(),
        plan.request_rate,
        plan.cells() as f64 * (plan.duration.as_secs_f64() + 0.3),
        plan.scrape,
        plan.poll,
    );
    let started = Instant::now();
    let results = measure(plan, json)?;
    print_table(&results);
    if let Some(path) = json {
        println!("JSON: {}", path.display());
    }
    if let Some(path) = plot_path {
        draw(path, plan, &results)?;
        println!("plot: {}", path.display());
    }
    eprintln!("done in {:.0} s", started.elapsed().as_secs_f64());
    let lost: Vec<String> = results.iter().filter_map(RunResult::mismatch).collect();
    if !lost.is_empty() {
        bail!(
            "the counts disagree (nothing may be lost or counted twice): {}",
            lost.join("; ")
        );
    }
    Ok(())
}

/// Runs each cell, with a progress line per cell on standard error, and writes the JSON (when
/// asked) after each, so that a run stopped half-way keeps what it measured.
fn measure(plan: &Plan, json: Option<&std::path::Path>) -> Result<Vec<RunResult>> {
    let cells = plan.cells();
    let mut results: Vec<RunResult> = Vec::new();
    // Rates outside, modes inside: the machine's drift falls on every mode alike.
    for &rate in &plan.rates {
        for m in &plan.modes {
            let r = run_one(
                m,
                plan.request_rate,
                rate,
                plan.scrape,
                plan.poll,
                plan.duration,
            )?;
            eprintln!(
                "  [{}/{cells}] {m} at {rate}/s: p99 {:.1} us, {} scrapes, {}",
                results.len() + 1,
                r.load.p99_us,
                r.service.scrapes,
                match r.mismatch() {
                    None => "nothing lost".to_string(),
                    Some(m) => format!("MISMATCH: {m}"),
                }
            );
            results.push(r);
            if let Some(path) = json {
                write_json(path, &results)?;
            }
        }
    }
    Ok(results)
}

/// The instances' descriptions, then one row per cell and the columns' legend.
fn print_table(results: &[RunResult]) {
    if let Some(first) = results.first() {
        println!("{}", first.qpw);
        for r in results.iter().skip(1).filter(|r| r.qpw != first.qpw) {
            println!("{}", r.qpw);
        }
    }
    println!(
        "\n{:<7} {:>7} | {:>8} {:>8} {:>8} {:>9} | {:>8} {:>8} | {:>7} {:>7} | {:>7} {:>7} | {:>9} {:>9} | {:>6} {:>6} {:>6} {:>6} {:>3}",
        "mode",
        "scrape/s",
        "req p50",
        "p99",
        "p99.9",
        "max",
        "srv p99",
        "srv max",
        "vol/scr",
        "inv/scr",
        "fnc/scr",
        "ans/scr",
        "scrape50",
        "scrape99",
        "sent",
        "served",
        "scrapd",
        "replid",
        "ok"
    );
    for r in results {
        let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        println!(
            "{:<7} {:>7} | {:>8.1} {:>8.1} {:>8.1} {:>9.1} | {:>8} {:>8} | {:>7.2} {:>7.2} | {:>7.3} {:>7.2} | {:>9} {:>9} | {:>6} {:>6} {:>6} {:>6} {:>3}",
            r.mode,
            r.scrape_rate,
            r.load.p50_us,
            r.load.p99_us,
            r.load.p999_us,
            r.load.max_us,
            opt(r.service.at_server.map(|p| p.p99_us)),
            opt(r.service.at_server.map(|p| p.max_us)),
            r.voluntary_per_scrape,
            r.involuntary_per_scrape,
            r.fences_per_scrape,
            r.answers_per_scrape,
            opt(r.service.scrape_p50_us),
            opt(r.service.scrape_p99_us),
            r.load.sent,
            r.service.served,
            r.service.scraped,
            r.load.received,
            if r.mismatch().is_none() { "yes" } else { "NO" }
        );
    }
    println!(
        "(request round trips in us, from the load generator on the housekeeping CPU; srv p99/max: \
         from the request's send to its reply, timed by the serving thread (no load-generator \
         receive side); vol/scr and \
         inv/scr: the serving threads' voluntary and involuntary context switches per scrape; \
         fnc/scr and ans/scr, fenced mode: the scrapes' flags settled by a membarrier fence of a \
         serving CPU (an interrupt there) and answered by a serving thread (in its lock, or by \
         its poll between requests), per scrape; scrape50/99: one scrape's duration in us; sent, served, scrapd, replid: requests sent, \
         answered by the servers, counted by the scrapes (every periodic one and a last one at \
         the end), and answered back to the load generator, each once; ok: scrapd = served = \
         replid, no reply twice. A request dropped by a full socket before the server shows as \
         sent > served and is no loss of the library's.)"
    );
}

/// Request p99 against scrape rate, one series per mode, as SVG at `path`.
fn draw(path: &std::path::Path, plan: &Plan, results: &[RunResult]) -> Result<()> {
    let series: Vec<plot::Series> = plan
        .modes
        .iter()
        .map(|m| {
            let pts = results
                .iter()
                .filter(|r| r.mode == *m)
                .map(|r| (r.scrape_rate, r.load.p99_us))
                .collect();
            (m.to_string(), pts)
        })
        .collect();
    let svg = plot::chart(
        &format!(
            "request p99 at {} requests/s, by scrape rate",
            plan.request_rate
        ),
        "scrapes per second",
        "request round trip p99 (us)",
        &series,
    );
    std::fs::write(path, svg).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes every cell measured so far as a JSON array.
fn write_json(path: &std::path::Path, results: &[RunResult]) -> Result<()> {
    let text = serde_json::to_string_pretty(results)?;
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
