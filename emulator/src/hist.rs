//! Fixed-width latency histograms, as oslat and cyclictest keep them, with the exact figures
//! they lose.
//!
//! oslat counts every gap in one of `bucket_size` buckets of `bucket_width` each, the last one
//! "including overflows", and keeps the *overflow sum* so that its average stays right however
//! far the spikes go. This histogram does the same in nanoseconds, and keeps three more things
//! so that nothing we report is a guess:
//!
//! - the exact sum of every sample, so the exact average is there next to oslat's
//!   bucket-edge average;
//! - the overflowed samples themselves (up to [`Histogram::OVERFLOW_KEEP`] of them, in storage
//!   reserved up front so the measuring loop never allocates), so percentiles that land past
//!   the last bucket are exact too;
//! - min and max.
//!
//! A percentile inside the bucket range is reported as the upper edge of its bucket (what
//! oslat's labels mean: "this many gaps took at most this long"), except in a histogram of
//! whole units ([`Histogram::whole_units`], cyclictest's): there every sample is a whole number
//! of the width, so a bucket holds one value, its lower edge, and that value is exact.
//!
//! oslat's `-B` (bias) moves the first bucket: with an origin, bucket `i` holds
//! `origin + i * width` up to `origin + (i + 1) * width`, and samples below the origin count in
//! the first bucket, as oslat counts them.

/// A latency histogram in nanoseconds.
#[derive(Debug, Clone)]
pub struct Histogram {
    width_ns: u64,
    origin_ns: u64,
    whole_units: bool,
    counts: Vec<u64>,
    count: u64,
    sum_ns: u128,
    min_ns: u64,
    max_ns: u64,
    overflow: u64,
    overflow_sum_ns: u128,
    overflow_values: Vec<u64>,
}

/// The percentiles every report shows, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
    /// 99.99th percentile.
    pub p99_99: f64,
    /// The largest sample.
    pub max: f64,
    /// The percentiles (`p50`, ..., `p99_99`) that fall past the last bucket among more
    /// overflowed samples than were kept: each is known only to be over the last bucket, and
    /// its figure is that bucket's upper edge, a lower bound. Empty when every figure is a
    /// bucket's value or an exact sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub over_last_bucket: Vec<String>,
}

impl Percentiles {
    /// Whether the percentile named `name` (`p99`) is only known to be over the last bucket.
    pub fn is_lower_bound(&self, name: &str) -> bool {
        self.over_last_bucket.iter().any(|n| n == name)
    }
}

impl std::fmt::Display for Percentiles {
    /// `p50 1.000 p90 ... max 12.000 us`, as our extra lines print them; a percentile over the
    /// last bucket as `p50 >0.032`, with a note.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (name, label, v) in [
            ("p50", "p50", self.p50),
            ("p90", "p90", self.p90),
            ("p99", "p99", self.p99),
            ("p99_9", "p99.9", self.p99_9),
            ("p99_99", "p99.99", self.p99_99),
        ] {
            let over = if self.is_lower_bound(name) { ">" } else { "" };
            write!(f, "{label} {over}{v:.3} ")?;
        }
        write!(f, "max {:.3} us", self.max)?;
        if !self.over_last_bucket.is_empty() {
            write!(
                f,
                " (>: over the last bucket; more samples overflowed than were kept, so those \
                 percentiles are not known)"
            )?;
        }
        Ok(())
    }
}

impl Histogram {
    /// How many overflowed samples are kept for exact tail percentiles.
    pub const OVERFLOW_KEEP: usize = 1 << 16;

    /// A histogram of `buckets` buckets of `width_ns` each (both at least 1).
    pub fn new(buckets: usize, width_ns: u64) -> Self {
        let buckets = buckets.max(1);
        Self {
            width_ns: width_ns.max(1),
            origin_ns: 0,
            whole_units: false,
            counts: vec![0; buckets],
            count: 0,
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            overflow: 0,
            overflow_sum_ns: 0,
            overflow_values: Vec::with_capacity(Self::OVERFLOW_KEEP),
        }
    }

    /// A histogram of samples that are whole multiples of `unit_ns` (cyclictest's latencies,
    /// whole microseconds or nanoseconds): bucket `i` holds the value `i * unit_ns` exactly.
    pub fn whole_units(buckets: usize, unit_ns: u64) -> Self {
        Self {
            whole_units: true,
            ..Self::new(buckets, unit_ns)
        }
    }

    /// The same histogram with its first bucket starting at `origin_ns` (oslat's bias).
    pub fn with_origin(mut self, origin_ns: u64) -> Self {
        self.origin_ns = origin_ns;
        self
    }

    /// Counts one sample. Never allocates.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.count += 1;
        self.sum_ns += u128::from(ns);
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
        let idx = ns.saturating_sub(self.origin_ns) / self.width_ns;
        match self.counts.get_mut(idx as usize) {
            Some(slot) => *slot += 1,
            None => self.record_overflow(ns),
        }
    }

    #[cold]
    #[inline(never)]
    fn record_overflow(&mut self, ns: u64) {
        self.overflow += 1;
        self.overflow_sum_ns += u128::from(ns);
        if self.overflow_values.len() < Self::OVERFLOW_KEEP {
            self.overflow_values.push(ns);
        }
    }

    /// Forgets every sample (after a warm-up), keeping the shape.
    pub fn clear(&mut self) {
        let (buckets, width) = (self.counts.len(), self.width_ns);
        let (origin, whole) = (self.origin_ns, self.whole_units);
        let mut values = std::mem::take(&mut self.overflow_values);
        values.clear();
        *self = Self::new(buckets, width);
        self.overflow_values = values;
        self.origin_ns = origin;
        self.whole_units = whole;
    }

    /// Adds another histogram of the same shape.
    pub fn merge(&mut self, other: &Histogram) {
        debug_assert_eq!(self.width_ns, other.width_ns);
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        self.overflow += other.overflow;
        self.overflow_sum_ns += other.overflow_sum_ns;
        let room = Self::OVERFLOW_KEEP.saturating_sub(self.overflow_values.len());
        self.overflow_values
            .extend(other.overflow_values.iter().take(room));
    }

    /// The bucket width in nanoseconds.
    pub fn width_ns(&self) -> u64 {
        self.width_ns
    }

    /// Where the first bucket starts, in nanoseconds (0 but with oslat's bias).
    pub fn origin_ns(&self) -> u64 {
        self.origin_ns
    }

    /// The value a bucket stands for: its lower edge in a histogram of whole units, else its
    /// upper edge.
    fn bucket_value_ns(&self, i: usize) -> u64 {
        let lower = self.origin_ns + i as u64 * self.width_ns;
        if self.whole_units {
            lower
        } else {
            lower + self.width_ns
        }
    }

    /// The number of buckets (not counting the overflow).
    pub fn buckets(&self) -> usize {
        self.counts.len()
    }

    /// The in-range bucket counts.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Samples counted.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Samples past the last bucket.
    pub fn overflow(&self) -> u64 {
        self.overflow
    }

    /// The sum of the samples past the last bucket, in nanoseconds.
    pub fn overflow_sum_ns(&self) -> u128 {
        self.overflow_sum_ns
    }

    /// The smallest sample (0 when empty).
    pub fn min_ns(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.min_ns
        }
    }

    /// The largest sample.
    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// The exact average in nanoseconds (0 when empty).
    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.count as f64
        }
    }

    /// oslat's average: each in-range sample counted at its bucket's upper edge, each
    /// overflowed sample at its exact value (the overflow sum), in nanoseconds.
    pub fn bucket_mean_ns(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let in_range: f64 = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, &c)| c as f64 * self.bucket_value_ns(i) as f64)
            .sum();
        (in_range + self.overflow_sum_ns as f64) / self.count as f64
    }

    /// Samples of at least `ns` (`ns` rounded down to a bucket edge when it falls inside the
    /// range; exact past it as long as every overflowed sample was kept).
    pub fn count_at_least(&self, ns: u64) -> u64 {
        let first = (ns.saturating_sub(self.origin_ns) / self.width_ns) as usize;
        let in_range: u64 = self.counts.iter().skip(first).sum();
        let past = if first >= self.counts.len() && self.overflow_kept_all() {
            self.overflow_values.iter().filter(|&&v| v >= ns).count() as u64
        } else {
            self.overflow
        };
        in_range + past
    }

    /// Whether every overflowed sample was kept (so tail percentiles are exact).
    pub fn overflow_kept_all(&self) -> bool {
        self.overflow_values.len() as u64 == self.overflow
    }

    /// The overflowed samples kept (all of them when [`overflow_kept_all`](Self::overflow_kept_all)).
    pub fn overflow_samples(&self) -> &[u64] {
        &self.overflow_values
    }

    /// The non-zero buckets keyed by the value they stand for in microseconds (upper edge, or
    /// the exact value in a histogram of whole units); past the range, the overflowed samples
    /// grouped by microsecond (rounded up), and any not kept at the max.
    pub fn nonzero_buckets_us(&self) -> Vec<(f64, u64)> {
        let mut out: Vec<(f64, u64)> = self
            .counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (self.bucket_value_ns(i) as f64 / 1000.0, c))
            .collect();
        let mut tail = std::collections::BTreeMap::<u64, u64>::new();
        for ns in &self.overflow_values {
            *tail.entry(ns.div_ceil(1000)).or_default() += 1;
        }
        out.extend(tail.into_iter().map(|(us, c)| (us as f64, c)));
        let lost = self.overflow - self.overflow_values.len() as u64;
        if lost > 0 {
            out.push((self.max_ns as f64 / 1000.0, lost));
        }
        out
    }

    /// The `q`-quantile (0 < q <= 1) in nanoseconds: the value of the bucket that holds it
    /// (its upper edge, or its exact value in a histogram of whole units), or the exact sample
    /// when it lies past the last bucket; there, when not every overflowed sample was kept, it
    /// is not known, and the last bucket's upper edge is given (see [`Self::quantile`]).
    pub fn quantile_ns(&self, q: f64) -> u64 {
        self.quantile(q).0
    }

    /// [`Self::quantile_ns`], and whether the figure is only a lower bound: the quantile lies
    /// past the last bucket among more overflowed samples than were kept (the kept ones are the
    /// first, not a sample of all, so no percentile can be read off them).
    pub fn quantile(&self, q: f64) -> (u64, bool) {
        if self.count == 0 {
            return (0, false);
        }
        // The rank of the sample asked for, 1-based: at least one, at most all.
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return (self.bucket_value_ns(i).min(self.max_ns), false);
            }
        }
        if rank == self.count {
            return (self.max_ns, false);
        }
        if !self.overflow_kept_all() {
            let edge = self.origin_ns + self.counts.len() as u64 * self.width_ns;
            return (edge, true);
        }
        // Past the range: the (rank - seen)-th smallest overflowed sample.
        let mut tail = self.overflow_values.clone();
        tail.sort_unstable();
        let k = (rank - seen) as usize;
        let v = tail
            .get(k.saturating_sub(1))
            .copied()
            .unwrap_or(self.max_ns);
        (v, false)
    }

    /// p50, p90, p99, p99.9, p99.99 and max, in microseconds.
    pub fn percentiles_us(&self) -> Percentiles {
        let mut over = Vec::new();
        let mut at = |name: &str, q: f64| {
            let (ns, lower_bound) = self.quantile(q);
            if lower_bound {
                over.push(name.to_string());
            }
            ns as f64 / 1000.0
        };
        let (p50, p90, p99) = (at("p50", 0.50), at("p90", 0.90), at("p99", 0.99));
        let (p99_9, p99_99) = (at("p99_9", 0.999), at("p99_99", 0.9999));
        Percentiles {
            p50,
            p90,
            p99,
            p99_9,
            p99_99,
            max: self.max_ns as f64 / 1000.0,
            over_last_bucket: over,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_units_report_exact_values_and_origin_shifts_buckets() {
        let mut h = Histogram::whole_units(10, 1000);
        for us in [3, 3, 5, 12] {
            h.record(us * 1000);
        }
        assert_eq!(h.quantile_ns(0.5), 3000);
        assert_eq!(h.quantile_ns(0.75), 5000);
        assert_eq!(h.quantile_ns(1.0), 12_000);
        assert_eq!(h.nonzero_buckets_us()[0], (3.0, 2));
        let mut b = Histogram::new(4, 1000).with_origin(2000);
        for ns in [500, 2500, 3999, 9000] {
            b.record(ns);
        }
        // Below the origin counts in the first bucket, as oslat's bias does.
        assert_eq!(b.counts(), &[2, 1, 0, 0]);
        assert_eq!(b.overflow(), 1);
        assert_eq!(b.quantile_ns(0.5), 3000);
        b.clear();
        assert_eq!(b.origin_ns(), 2000);
    }

    #[test]
    fn buckets_overflow_and_exact_average() {
        let mut h = Histogram::new(4, 1000);
        for ns in [10, 999, 1000, 2500, 10_000, 1_000_000] {
            h.record(ns);
        }
        assert_eq!(h.counts(), &[2, 1, 1, 0]);
        assert_eq!(h.overflow(), 2);
        assert_eq!(h.overflow_sum_ns(), 1_010_000);
        assert_eq!(h.min_ns(), 10);
        assert_eq!(h.max_ns(), 1_000_000);
        let exact = (10 + 999 + 1000 + 2500 + 10_000 + 1_000_000) as f64 / 6.0;
        assert!((h.mean_ns() - exact).abs() < 1e-6);
        // oslat's average: 1000 + 1000 + 2000 + 3000 + the exact overflow sum.
        let oslat = (1000.0 + 1000.0 + 2000.0 + 3000.0 + 1_010_000.0) / 6.0;
        assert!((h.bucket_mean_ns() - oslat).abs() < 1e-6);
    }

    #[test]
    fn quantiles_use_bucket_edges_then_exact_tail() {
        let mut h = Histogram::new(10, 1000);
        for _ in 0..98 {
            h.record(500);
        }
        h.record(50_000);
        h.record(70_000);
        assert_eq!(h.quantile_ns(0.5), 1000); // the bucket upper edge
        assert_eq!(h.quantile_ns(0.98), 1000);
        assert_eq!(h.quantile_ns(0.99), 50_000);
        assert_eq!(h.quantile_ns(1.0), 70_000);
        let p = h.percentiles_us();
        assert_eq!(p.max, 70.0);
        assert_eq!(p.p99_99, 70.0);
        assert_eq!(h.count_at_least(1000), 2);
        assert_eq!(h.count_at_least(60_000), 1);
    }

    /// `oslat --bucket-width 1`: nearly every gap past the last bucket, far more than are
    /// kept. The percentiles there are not known: they say "over the last bucket", not the max
    /// (which every one of them read before, 43.860 us against an average of 0.043).
    #[test]
    fn percentiles_past_the_kept_overflows_are_over_the_last_bucket_not_the_max() {
        let mut h = Histogram::new(32, 1);
        let n = Histogram::OVERFLOW_KEEP as u64 * 3;
        for i in 0..n {
            h.record(40 + i % 7);
        }
        h.record(43_860);
        assert!(!h.overflow_kept_all());
        let p = h.percentiles_us();
        assert_eq!(p.p50, 0.032, "{p:?}");
        assert!(
            p.is_lower_bound("p50") && p.is_lower_bound("p99_99"),
            "{p:?}"
        );
        assert_eq!(p.max, 43.86);
        let text = p.to_string();
        assert!(text.starts_with("p50 >0.032 "), "{text}");
        assert!(text.contains("over the last bucket"), "{text}");
        // With every overflow kept the tail is exact, and says so by saying nothing.
        let mut e = Histogram::new(4, 1);
        for ns in [1, 2, 50, 60] {
            e.record(ns);
        }
        let p = e.percentiles_us();
        assert!(p.over_last_bucket.is_empty());
        assert_eq!(e.quantile_ns(0.75), 50);
    }

    #[test]
    fn empty_and_merge() {
        let mut a = Histogram::new(2, 10);
        assert_eq!(a.quantile_ns(0.99), 0);
        assert_eq!(a.min_ns(), 0);
        let mut b = Histogram::new(2, 10);
        b.record(5);
        b.record(500);
        a.merge(&b);
        a.clear();
        assert_eq!(a.count(), 0);
        a.merge(&b);
        assert_eq!(a.count(), 2);
        assert_eq!(a.overflow(), 1);
    }
}
