//! A latency-sensitive service built on qpw-core, as a service developer would write it: a UDP
//! request/response server with one thread pinned per serving CPU, per-CPU state (a request
//! counter, a latency histogram, a free list of buffers) in a [`PerCpu`], and a metrics thread
//! on a housekeeping CPU that scrapes every CPU's state through the library at a set rate and
//! serves it as Prometheus text over HTTP. A load generator sends requests at a fixed rate and
//! records each round trip.
//!
//! The question it answers: what each mode costs the requests when the metrics are scraped.
//! The scrape takes each CPU's counts and histogram with [`Qpw::collector`], per-CPU *work*:
//! in queue mode it runs on the serving CPU's worker (a context switch on the serving thread's
//! CPU per scrape, as the kernel's `queue_work_on` + `flush_work`), in remote and fenced mode
//! in the metrics thread under the serving CPU's lock. `--scrape walk` uses
//! [`PerCpu::take_each`] instead, the walk the crate recommends for scrapes in every mode.
//!
//! The serving CPUs are every allowed CPU but the first (the housekeeping CPU, which runs the
//! metrics thread, the HTTP endpoint and the load generator); the last one stands for the
//! isolated CPU, declared so with [`qpw_core::Builder::isolated`]: the default policy
//! ([`Policy::Auto`]) runs it in remote mode and the housekeeping CPU in queue mode. On one CPU
//! everything shares it, and the run says so.
//!
//! [`PerCpu`]: qpw_core::PerCpu
//! [`PerCpu::take_each`]: qpw_core::PerCpu::take_each
//! [`Policy::Auto`]: qpw_core::Policy::Auto
//! [`Qpw::collector`]: qpw_core::Qpw::collector

#![warn(missing_docs, unsafe_op_in_unsafe_fn)]

mod config;
mod http;
mod latency;
mod load;
mod metrics;
pub mod plot;
mod request;
mod run;
mod scrape;
mod server;
mod service;

pub use config::{duration, policy, Config, Poll, Scrape};
pub use latency::Percentiles;
pub use load::{load, LoadReport};
pub use run::{run_one, RunResult};
pub use server::switches;
pub use service::{Service, ServiceReport};
