//! Logging a failure that repeats without flooding the log: the first one, then at growing
//! gaps (the 2nd, 4th, 8th, ...), each line saying how many went unlogged in between.

/// Counts one run of consecutive failures of the same thing (a sink, Redis, a subscription).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Repeated {
    failures: u64,
    logged: u64,
}

impl Repeated {
    /// Counts a failure. `Some(unlogged)` when this one should be logged, with the number
    /// of failures since the last line that were not.
    pub(crate) fn failed(&mut self) -> Option<u64> {
        self.failures += 1;
        self.failures.is_power_of_two().then(|| {
            let unlogged = self.failures - self.logged - 1;
            self.logged = self.failures;
            unlogged
        })
    }

    /// Ends the run: `Some(failures)` if there was one, so the recovery can be logged once.
    pub(crate) fn recovered(&mut self) -> Option<u64> {
        let failures = std::mem::take(&mut self.failures);
        self.logged = 0;
        (failures > 0).then_some(failures)
    }

    /// Failures in the current run, for backoff.
    pub(crate) fn count(&self) -> u32 {
        u32::try_from(self.failures).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_at_growing_gaps_and_counts_the_rest() {
        let mut r = Repeated::default();
        let logged: Vec<(u64, u64)> = (1..=20)
            .filter_map(|i| r.failed().map(|unlogged| (i, unlogged)))
            .collect();
        assert_eq!(logged, [(1, 0), (2, 0), (4, 1), (8, 3), (16, 7)]);
        assert_eq!(r.count(), 20);
        assert_eq!(r.recovered(), Some(20));
        assert_eq!(r.recovered(), None);
        assert_eq!(r.failed(), Some(0), "a new run logs its first failure");
    }
}
