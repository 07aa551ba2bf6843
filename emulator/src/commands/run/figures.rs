//! The figures the table and the notes give: the threshold, the idle baseline's rate, the
//! excess interruptions per drain round by round, and the medians.

use super::acc::Acc;
use super::{Ctx, MIN_ROUND_DRAINS, OTHER_THRESHOLDS_NS, THRESHOLD_NS};

impl Ctx {
    /// The interruption threshold, once the idle baseline has measured something.
    pub(super) fn threshold(&self) -> Option<(u64, String)> {
        self.scenarios
            .first()
            .filter(|idle| idle.hist.count() > 0)
            .map(|_| {
                (
                    THRESHOLD_NS,
                    "fixed at 5 us: above the probe's own operation and this kind of VM's dense \
                     band of 1-3 us noise (per_second_at_us: the rate at other thresholds)"
                        .to_string(),
                )
            })
    }

    pub(super) fn baseline_rate(&self) -> f64 {
        self.scenarios
            .first()
            .map_or(0.0, |idle| self.rate_at_threshold(idle))
    }

    /// A scenario's excess interruptions per drain in each round, against the idle rate of the
    /// same round (the idle scenario runs first in every round), or `pooled_baseline` for a
    /// round the idle scenario has no slice of.
    pub(super) fn excess_by_round(
        &self,
        acc: &Acc,
        threshold_ns: u64,
        pooled_baseline: f64,
    ) -> Vec<Option<f64>> {
        let idle = self
            .scenarios
            .first()
            .map(|idle| idle.by_round.as_slice())
            .unwrap_or_default();
        acc.by_round
            .iter()
            .enumerate()
            .map(|(k, part)| {
                // Kernel rows run without the probe's local operation and the load, unlike the
                // idle baseline: no excess against it (the trace's gaps per drain stand in).
                if part.target_drains < MIN_ROUND_DRAINS || acc.workload.kernel().is_some() {
                    return None;
                }
                let baseline = idle
                    .get(k)
                    .filter(|i| i.seconds > 0.0)
                    .map_or(pooled_baseline, |i| {
                        i.hist.count_at_least(threshold_ns) as f64 / i.seconds
                    });
                let count = part.hist.count_at_least(threshold_ns) as f64;
                Some((count - baseline * part.seconds) / part.target_drains as f64)
            })
            .collect()
    }

    /// A scenario's gaps at or above the threshold, per second.
    pub(super) fn rate_at_threshold(&self, a: &Acc) -> f64 {
        match self.threshold() {
            Some((ns, _)) if a.seconds > 0.0 => a.hist.count_at_least(ns) as f64 / a.seconds,
            _ => 0.0,
        }
    }
}

/// A scenario's gaps per second at each of [`OTHER_THRESHOLDS_NS`], as `(us, per second)`.
pub(super) fn rates_at_thresholds(a: &Acc) -> Vec<(f64, f64)> {
    let seconds = a.seconds.max(1e-9);
    OTHER_THRESHOLDS_NS
        .iter()
        .map(|&t| (t as f64 / 1000.0, a.hist.count_at_least(t) as f64 / seconds))
        .collect()
}

/// The median of `values` (the mean of the middle two for an even count), or `None` if there
/// are none.
pub(super) fn median<'a>(values: impl IntoIterator<Item = &'a f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().copied().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_no_values() {
        assert_eq!(median(&[3.0, -1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[0.5]), Some(0.5));
        assert_eq!(median(&[]), None);
    }
}
