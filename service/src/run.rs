//! One cell of a comparison: the service under load in one mode at one scrape rate, and the
//! check that nothing was lost or counted twice.

use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use crate::config::{policy, Config, Poll, Scrape};
use crate::load::{load, LoadReport};
use crate::service::{Service, ServiceReport};

/// One cell of a comparison: one mode at one scrape rate.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// The mode policy's name.
    pub mode: String,
    /// How the instance ran each CPU.
    pub qpw: String,
    /// Requests per second sent.
    pub request_rate: f64,
    /// Scrapes per second asked for.
    pub scrape_rate: f64,
    /// How the scrape reached the CPUs.
    pub scrape: Scrape,
    /// How the serving threads waited for requests.
    pub poll: Poll,
    /// Seconds of load.
    pub seconds: f64,
    /// The load generator's figures.
    pub load: LoadReport,
    /// The service's figures.
    pub service: ServiceReport,
    /// The serving threads' voluntary and involuntary context switches during the load, per
    /// scrape.
    pub voluntary_per_scrape: f64,
    /// See `voluntary_per_scrape`.
    pub involuntary_per_scrape: f64,
    /// Fenced mode: the scrapes' flags on the serving CPUs' locks settled by a `membarrier`
    /// fence (an interrupt on the serving CPU), per scrape; the others were answered by the
    /// serving threads ([`qpw_core::fenced_lock::fence_counts`], over the load). 0 in the
    /// other modes.
    pub fences_per_scrape: f64,
    /// See `fences_per_scrape`: the flags the serving CPUs answered, per scrape.
    pub answers_per_scrape: f64,
    /// Whether the scraped counts equal the requests served: the library's part, no count
    /// lost or taken twice by the scrapes.
    pub nothing_lost: bool,
    /// Whether every request served got exactly one reply at the load generator (replies
    /// equal to requests served, no duplicate): the sockets' part. A request dropped before
    /// the server (its socket full) is neither served nor replied, and shows as `sent` above
    /// `served`.
    pub replies_match: bool,
}

impl RunResult {
    /// What disagrees, if anything: the scraped counts against the requests served, or the
    /// replies against them.
    pub fn mismatch(&self) -> Option<String> {
        let (l, s) = (&self.load, &self.service);
        let mut what = Vec::new();
        if !self.nothing_lost {
            what.push(format!(
                "scraped {} requests but served {}",
                s.scraped, s.served
            ));
        }
        if !self.replies_match {
            what.push(format!(
                "served {} requests but {} got a reply ({} duplicate replies)",
                s.served, l.received, l.duplicates
            ));
        }
        (!what.is_empty()).then(|| {
            format!(
                "{} at {}/s: {}",
                self.mode,
                self.scrape_rate,
                what.join(", ")
            )
        })
    }
}

/// Runs the service under load for `duration` in one mode at one scrape rate, and checks that
/// the scrapes counted every request served exactly once.
pub fn run_one(
    mode: &str,
    request_rate: f64,
    scrape_rate: f64,
    scrape: Scrape,
    poll: Poll,
    duration: Duration,
) -> Result<RunResult> {
    let svc = Service::start(&Config {
        policy: policy(mode)?,
        scrape_rate,
        scrape,
        poll,
        http_port: None,
    })?;
    let before = svc.serving_switches();
    let fences_before = qpw_core::fenced_lock::fence_counts();
    let hk = svc.housekeeping();
    let load = load(&svc.addrs(), request_rate, duration, Some((hk, svc.qpw())));
    let after = svc.serving_switches();
    let fences = qpw_core::fenced_lock::fence_counts().since(&fences_before);
    let qpw = svc.describe();
    let service = svc.stop()?;
    let load = load?;
    let scrapes = service.scrapes.max(1) as f64;
    Ok(RunResult {
        mode: mode.to_string(),
        qpw,
        request_rate,
        scrape_rate,
        scrape,
        poll,
        seconds: duration.as_secs_f64(),
        nothing_lost: service.scraped == service.served,
        replies_match: load.received == service.served && load.duplicates == 0,
        voluntary_per_scrape: after.0.saturating_sub(before.0) as f64 / scrapes,
        involuntary_per_scrape: after.1.saturating_sub(before.1) as f64 / scrapes,
        fences_per_scrape: fences.fenced as f64 / scrapes,
        answers_per_scrape: fences.answered as f64 / scrapes,
        load,
        service,
    })
}
