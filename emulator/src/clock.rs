//! The probes' clocks: the TSC read back to back (oslat's `frc()`), calibrated against
//! `CLOCK_MONOTONIC`, and the monotonic clock itself for deadlines (cyclictest).
//!
//! On x86-64 a read is `lfence; rdtsc`, as oslat does it after the kernel's `rdtsc_ordered()`:
//! the fence keeps the read from being executed ahead of the loop's earlier work. Elsewhere the
//! "counter" is `CLOCK_MONOTONIC` in nanoseconds (a vDSO call, slower but honest), and the
//! reported frequency is 1000 MHz.

use std::time::Duration;

/// One reading of the probe's counter.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `lfence` and `rdtsc` exist on every x86-64 CPU and touch no memory.
        unsafe {
            core::arch::x86_64::_mm_lfence();
            core::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        monotonic_ns()
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
#[inline]
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `clock` (`CLOCK_MONOTONIC` or `CLOCK_REALTIME`) in nanoseconds.
#[inline]
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the callers pass clocks that exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn timespec(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}

/// Sleeps until `deadline_ns` on `CLOCK_MONOTONIC` (`clock_nanosleep(TIMER_ABSTIME)`), resuming
/// after signals.
pub fn sleep_until_ns(deadline_ns: u64) {
    sleep_until_on(libc::CLOCK_MONOTONIC, deadline_ns);
}

/// Sleeps until `deadline_ns` on `clock` (`clock_nanosleep(TIMER_ABSTIME)`), resuming after
/// signals.
pub fn sleep_until_on(clock: libc::clockid_t, deadline_ns: u64) {
    let ts = timespec(deadline_ns);
    loop {
        // SAFETY: `ts` is a valid timespec; the remainder pointer may be null with TIMER_ABSTIME.
        let rc =
            unsafe { libc::clock_nanosleep(clock, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
        if rc != libc::EINTR {
            return;
        }
    }
}

/// Sleeps until `deadline_ns` on `clock` (`clock_nanosleep(TIMER_ABSTIME)`), resuming after
/// signals unless `stop` is set: then returns `false` at once (woken to stop, see
/// [`crate::cyclictest`]); `true` once the deadline has come.
pub fn sleep_until_unless(
    clock: libc::clockid_t,
    deadline_ns: u64,
    stop: &std::sync::atomic::AtomicBool,
) -> bool {
    let ts = timespec(deadline_ns);
    loop {
        // SAFETY: `ts` is a valid timespec; the remainder pointer may be null with TIMER_ABSTIME.
        let rc =
            unsafe { libc::clock_nanosleep(clock, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
        if rc != libc::EINTR {
            return true;
        }
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
    }
}

/// Sleeps for `ns` (relative): `clock_nanosleep(clock, 0, ...)`, or `nanosleep()` when
/// `nanosleep` is set (cyclictest's `-r` and `-s`). A signal cuts the sleep short, as it does
/// cyclictest's.
pub fn sleep_for_ns(clock: libc::clockid_t, ns: u64, nanosleep: bool) {
    let ts = timespec(ns);
    // SAFETY: `ts` is a valid timespec; the remainder pointers may be null.
    unsafe {
        if nanosleep {
            libc::nanosleep(&ts, std::ptr::null_mut());
        } else {
            libc::clock_nanosleep(clock, 0, &ts, std::ptr::null_mut());
        }
    }
}

/// The counter's rate, and the conversion from ticks to nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    /// Ticks per second.
    pub hz: u64,
    /// Nanoseconds per tick as a 32.32 fixed-point number.
    mult: u64,
}

impl Calibration {
    /// Measures the counter against `CLOCK_MONOTONIC` over windows of about 20 ms until two
    /// windows in a row agree within 0.1 % (oslat's rule), at most ten windows.
    pub fn measure() -> Self {
        if !cfg!(target_arch = "x86_64") {
            return Self::from_hz(1_000_000_000);
        }
        let window = |len: Duration| -> u64 {
            let (t0, c0) = (monotonic_ns(), ticks());
            let end = t0 + len.as_nanos() as u64;
            let mut now = t0;
            while now < end {
                now = monotonic_ns();
            }
            let c1 = ticks();
            ((c1 - c0) as u128 * 1_000_000_000 / u128::from((now - t0).max(1))) as u64
        };
        let mut prev = window(Duration::from_millis(20));
        for _ in 0..10 {
            let hz = window(Duration::from_millis(20));
            if hz.abs_diff(prev) <= hz / 1000 {
                return Self::from_hz(hz);
            }
            prev = hz;
        }
        Self::from_hz(prev)
    }

    /// A calibration for a counter of `hz` ticks per second.
    pub fn from_hz(hz: u64) -> Self {
        let hz = hz.max(1);
        Self {
            hz,
            mult: ((1_000_000_000u128 << 32) / u128::from(hz)) as u64,
        }
    }

    /// `ticks` in nanoseconds.
    #[inline(always)]
    pub fn to_ns(&self, ticks: u64) -> u64 {
        ((u128::from(ticks) * u128::from(self.mult)) >> 32) as u64
    }

    /// `ns` in ticks.
    pub fn from_ns(&self, ns: u64) -> u64 {
        (u128::from(ns) * u128::from(self.hz) / 1_000_000_000) as u64
    }

    /// The counter's frequency in MHz, as oslat reports it.
    pub fn mhz(&self) -> u64 {
        self.hz / 1_000_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_trip() {
        let cal = Calibration::from_hz(2_445_000_000);
        assert_eq!(cal.mhz(), 2445);
        let ticks = cal.from_ns(1_000_000);
        assert!(cal.to_ns(ticks).abs_diff(1_000_000) <= 1);
        // Large gaps (seconds) must not overflow.
        assert!(
            cal.to_ns(cal.from_ns(10_000_000_000))
                .abs_diff(10_000_000_000)
                <= 50
        );
    }

    #[test]
    fn measured_rate_matches_the_monotonic_clock() {
        let cal = Calibration::measure();
        let (t0, c0) = (monotonic_ns(), ticks());
        std::thread::sleep(Duration::from_millis(30));
        let (t1, c1) = (monotonic_ns(), ticks());
        let ratio = cal.to_ns(c1 - c0) as f64 / (t1 - t0) as f64;
        // A loose bound: this asserts the conversion is right, not how fast anything is.
        assert!((0.9..1.1).contains(&ratio), "ratio {ratio}");
    }
}
