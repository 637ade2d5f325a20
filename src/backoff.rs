//! Exponential backoff with jitter, for retried messages and reconnects.

use std::time::Duration;

use rand::Rng;

/// Doubling backoff between `initial` and `max`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    /// Delay after the first failure.
    pub initial: Duration,
    /// Upper bound of every delay.
    pub max: Duration,
}

impl Backoff {
    /// The un-jittered delay before attempt `failures + 1`: `initial * 2^(failures-1)`, capped.
    pub(crate) fn base(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(32);
        self.initial
            .saturating_mul(1u32 << exp.min(31))
            .min(self.max)
    }

    /// [`Self::base`] with "equal jitter": uniformly in `[base/2, base]`, so retries of one
    /// batch spread out but never wait less than half the nominal delay.
    pub(crate) fn delay(&self, failures: u32) -> Duration {
        let base = self.base(failures);
        let half = base / 2;
        let extra = rand::thread_rng().gen_range(0..=half.as_millis() as u64);
        half + Duration::from_millis(extra)
    }
}

/// Jitters an interval to `[3/4, 1]` of itself so replicas do not wake in lock-step.
pub(crate) fn jitter_down(interval: Duration) -> Duration {
    let quarter = interval / 4;
    let extra = rand::thread_rng().gen_range(0..=quarter.as_micros() as u64);
    interval - quarter + Duration::from_micros(extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps() {
        let b = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(10),
        };
        assert_eq!(b.base(1), Duration::from_secs(1));
        assert_eq!(b.base(2), Duration::from_secs(2));
        assert_eq!(b.base(4), Duration::from_secs(8));
        assert_eq!(b.base(5), Duration::from_secs(10));
        assert_eq!(b.base(1000), Duration::from_secs(10));
        assert_eq!(b.base(0), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_within_half_and_full() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(60),
        };
        for failures in 1..20 {
            for _ in 0..50 {
                let d = b.delay(failures);
                assert!(d >= b.base(failures) / 2 && d <= b.base(failures), "{d:?}");
            }
        }
    }

    #[test]
    fn guard_jitter_never_exceeds_the_guard() {
        let g = Duration::from_secs(1);
        for _ in 0..100 {
            let d = jitter_down(g);
            assert!(d <= g && d >= g * 3 / 4);
        }
    }
}
