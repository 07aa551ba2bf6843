//! The memory traffic the hardware counts: a [`BandwidthSource`] applied by a traffic
//! thread every tick, or bytes injected by hand.

use std::fmt;
use std::time::{Duration, Instant};

use qpw_core::sync::Ordering;

use super::error::ResctrlError;
use super::event::Event;
use super::model::{Resctrl, Shared};

/// Where the memory traffic counted by the hardware comes from.
pub trait BandwidthSource: Send + Sync + fmt::Debug {
    /// Bytes per second that `rmid` moves in `domain`: (total, local), local <= total.
    fn bandwidth(&self, domain: usize, rmid: u32) -> (u64, u64);
    /// Bytes of L3 that `rmid` holds in `domain`.
    fn occupancy(&self, domain: usize, rmid: u32) -> u64;
}

/// A steady source: RMID `r` moves `total_bytes_per_sec x (1 + r % 4)`, of which
/// `local_percent` % is local, and holds `occupancy_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConstantBandwidth {
    /// Bytes/s of an RMID with `r % 4 == 0`.
    pub total_bytes_per_sec: u64,
    /// The local share, 0-100.
    pub local_percent: u8,
    /// L3 occupancy of every RMID.
    pub occupancy_bytes: u64,
}

impl Default for ConstantBandwidth {
    fn default() -> Self {
        Self {
            total_bytes_per_sec: 1 << 30,
            local_percent: 75,
            occupancy_bytes: 4 << 20,
        }
    }
}

impl BandwidthSource for ConstantBandwidth {
    fn bandwidth(&self, _domain: usize, rmid: u32) -> (u64, u64) {
        let total = self.total_bytes_per_sec * (1 + u64::from(rmid % 4));
        let local = total / 100 * u64::from(self.local_percent.min(100));
        (total, local)
    }

    fn occupancy(&self, _domain: usize, _rmid: u32) -> u64 {
        self.occupancy_bytes
    }
}

impl Resctrl {
    /// Adds traffic to `rmid` in `domain`: `total` bytes, of which `local` are local.
    pub fn inject_traffic(
        &self,
        rmid: u32,
        domain: usize,
        total: u64,
        local: u64,
    ) -> Result<(), ResctrlError> {
        self.shared.check_rmid(rmid, domain)?;
        self.shared
            .add_traffic(domain, rmid, total, local.min(total));
        Ok(())
    }

    /// Sets the L3 occupancy of `rmid` in `domain`.
    pub fn set_occupancy(&self, rmid: u32, domain: usize, bytes: u64) -> Result<(), ResctrlError> {
        self.shared.check_rmid(rmid, domain)?;
        let hw = &self.shared.hw;
        hw.truth[hw.idx(domain, rmid, Event::LlcOccupancy)].store(bytes, Ordering::Relaxed);
        Ok(())
    }
}

impl Shared {
    fn add_traffic(&self, domain: usize, rmid: u32, total: u64, local: u64) {
        let hw = &self.hw;
        hw.truth[hw.idx(domain, rmid, Event::MbmTotalBytes)].fetch_add(total, Ordering::Relaxed);
        hw.truth[hw.idx(domain, rmid, Event::MbmLocalBytes)].fetch_add(local, Ordering::Relaxed);
    }

    /// The traffic thread: applies the bandwidth source every tick.
    pub(super) fn traffic(&self, source: &dyn BandwidthSource, tick: Duration) {
        let mut last = Instant::now();
        let mut carry = vec![0u128; self.hw.nr_domains * self.hw.nr_rmids * 2];
        while !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(tick);
            let now = Instant::now();
            // A starved traffic thread drops what it missed beyond a few ticks rather than
            // adding it in one burst: hardware counts continuously, and a burst of many
            // wraps at once would break the one-wrap-per-read premise of
            // `mbm_overflow_count` through no fault of the readers.
            let dt = now.duration_since(last).min(tick * 4).as_nanos();
            last = now;
            for d in 0..self.hw.nr_domains {
                for r in 0..self.hw.nr_rmids {
                    if !self.hw.active[r].load(Ordering::Acquire) {
                        continue;
                    }
                    let (total, local) = source.bandwidth(d, r as u32);
                    let k = (d * self.hw.nr_rmids + r) * 2;
                    // Keep the sub-byte remainders so that the long-run rate is exact.
                    let t = u128::from(total) * dt + carry[k];
                    let l = u128::from(local.min(total)) * dt + carry[k + 1];
                    carry[k] = t % 1_000_000_000;
                    carry[k + 1] = l % 1_000_000_000;
                    self.add_traffic(
                        d,
                        r as u32,
                        (t / 1_000_000_000) as u64,
                        (l / 1_000_000_000) as u64,
                    );
                    let occ = source.occupancy(d, r as u32);
                    let i = self.hw.idx(d, r as u32, Event::LlcOccupancy);
                    self.hw.truth[i].store(occ, Ordering::Relaxed);
                }
            }
        }
    }
}
