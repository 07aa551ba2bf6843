//! The instances the integration tests build: logical (or allowed) CPUs under a fixed policy.

#![allow(dead_code, unreachable_pub)]

use qpw_core::{CpuSpec, Policy, Qpw};

/// An instance of `cpus` under `policy`; panics when it cannot be built.
pub fn instance_on(cpus: CpuSpec, policy: Policy) -> Qpw {
    Qpw::builder().cpus(cpus).policy(policy).build().unwrap()
}

/// `n` logical CPUs, every one in remote mode.
pub fn remote(n: usize) -> Qpw {
    instance_on(CpuSpec::Logical(n), Policy::Remote)
}

/// `n` logical CPUs: those in the CPU list `remote_cpus` (such as `"2-3"`) in remote mode,
/// the others in queue mode.
pub fn remote_on(n: usize, remote_cpus: &str) -> Qpw {
    instance_on(
        CpuSpec::Logical(n),
        Policy::RemoteOn(remote_cpus.parse().unwrap()),
    )
}

/// Two logical CPUs, one per mode: CPU 0 queues its drains, CPU 1 is drained remotely.
pub fn mixed() -> Qpw {
    remote_on(2, "1")
}
