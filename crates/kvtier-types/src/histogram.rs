//! A fixed-bucket histogram of durations: what the system's latency metrics count
//! (Prometheus `le` buckets; OpenTelemetry explicit bounds, the same ones).

use std::time::Duration;

/// Bucket upper bounds, in seconds: 100 µs to a minute, enough for a scheduling step
/// and for a request's time to first token.
pub const DURATION_BOUNDS: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// Durations counted into [`DURATION_BOUNDS`]' buckets (the last one is `+Inf`), with
/// their sum. `Copy` and integer-only, so stats that hold one stay comparable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is above every bound.
    counts: [u64; DURATION_BOUNDS.len() + 1],
    /// Their sum, in nanoseconds.
    sum_ns: u64,
}

impl Histogram {
    /// Counts one duration.
    pub fn observe(&mut self, d: Duration) {
        let secs = d.as_secs_f64();
        let bucket = DURATION_BOUNDS.partition_point(|&bound| bound < secs);
        self.counts[bucket] += 1;
        self.sum_ns = self
            .sum_ns
            .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Their sum, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_ns as f64 / 1e9
    }

    /// Observations per bucket (the last above every bound), not cumulative.
    pub fn bucket_counts(&self) -> &[u64] {
        &self.counts
    }

    /// Cumulative counts at each bound, as Prometheus' `le` buckets (without `+Inf`,
    /// which is [`Self::count`]).
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        DURATION_BOUNDS
            .iter()
            .zip(&self.counts)
            .scan(0, |total, (&bound, &n)| {
                *total += n;
                Some((bound, *total))
            })
    }
}

/// A wall-clock measurement kept beside a stats struct's counters. Timings differ from
/// run to run, so two of them compare equal whatever they hold: stats compare by what was
/// decided (the determinism and runtime-equivalence tests rely on it), never by how long
/// it took. Its `Debug` output leaves the value out for the same reason (traces of
/// calls are compared as text); read it through the metrics.
#[derive(Clone, Copy, Default)]
pub struct WallClock<T>(pub T);

impl<T> std::fmt::Debug for WallClock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WallClock(..)")
    }
}

impl<T> PartialEq for WallClock<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<T> Eq for WallClock<T> {}

impl<T> std::ops::Deref for WallClock<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for WallClock<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_land_in_the_first_bucket_whose_bound_they_do_not_exceed() {
        let mut h = Histogram::default();
        h.observe(Duration::from_micros(100)); // exactly the first bound
        h.observe(Duration::from_micros(101));
        h.observe(Duration::from_secs(3600)); // above every bound
        assert_eq!(h.count(), 3);
        assert_eq!(h.bucket_counts()[0], 1);
        assert_eq!(h.bucket_counts()[1], 1);
        assert_eq!(h.bucket_counts()[DURATION_BOUNDS.len()], 1);
        let cumulative: Vec<(f64, u64)> = h.cumulative().collect();
        assert_eq!(cumulative[0], (0.0001, 1));
        assert_eq!(cumulative[1], (0.00025, 2));
        assert_eq!(cumulative.last(), Some(&(60.0, 2)));
        assert!((h.sum_seconds() - 3600.000201).abs() < 1e-9);
        // Timings never make two stats differ.
        assert_eq!(WallClock(h), WallClock(Histogram::default()));
    }
}
