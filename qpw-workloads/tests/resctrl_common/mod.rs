//! What the resctrl integration tests share: models on emulated domains.

#![allow(dead_code, unreachable_pub)]

use qpw_workloads::resctrl::{Config, DomainLayout, Resctrl};

/// A model of `domains` emulated domains of `cpus_per_domain` logical CPUs, with `config`
/// otherwise, and no periodic overflow worker (tests run it with `run_overflow_now`).
pub fn emulated(domains: usize, cpus_per_domain: usize, config: Config) -> Resctrl {
    Resctrl::new(Config {
        layout: DomainLayout::Emulated {
            domains,
            cpus_per_domain,
        },
        overflow_interval: None,
        ..config
    })
    .unwrap()
}
