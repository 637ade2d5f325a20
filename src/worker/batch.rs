//! Adaptive claim size: grows while a backlog drains, shrinks when a claim script holds Redis too long.

use std::time::Duration;

/// How long one claim script may hold Redis (its own running time, by the Redis clock)
/// before batches shrink: keeps Redis responsive.
const CLAIM_TARGET: Duration = Duration::from_millis(4);

/// Claim size between 1 and the configured `batch`: doubles while full claims' scripts stay
/// under [`CLAIM_TARGET`] (a backlog is draining), halves when one runs more than twice that.
#[derive(Debug, Clone, Copy)]
pub(super) struct AdaptiveBatch {
    pub(super) size: usize,
    max: usize,
}

impl AdaptiveBatch {
    pub(super) fn new(max: usize) -> Self {
        Self {
            size: max.min(32),
            max,
        }
    }

    pub(super) fn adapt(&mut self, claimed: usize, took: Duration) {
        if took > CLAIM_TARGET * 2 {
            self.size = (self.size / 2).max(1);
        } else if claimed >= self.size && took < CLAIM_TARGET {
            self.size = (self.size * 2).min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_grow_while_full_and_fast_and_shrink_when_slow() {
        let mut b = AdaptiveBatch::new(256);
        assert_eq!(b.size, 32);
        b.adapt(32, Duration::from_millis(1));
        assert_eq!(b.size, 64);
        b.adapt(10, Duration::from_millis(1));
        assert_eq!(
            b.size, 64,
            "a partial claim means the backlog is drained: keep the size"
        );
        for _ in 0..10 {
            b.adapt(b.size, Duration::from_micros(500));
        }
        assert_eq!(b.size, 256, "never above the configured batch");
        b.adapt(256, Duration::from_millis(20));
        assert_eq!(b.size, 128);
        for _ in 0..20 {
            b.adapt(b.size, Duration::from_millis(50));
        }
        assert_eq!(b.size, 1, "never below one");
        let mut one = AdaptiveBatch::new(1);
        one.adapt(1, Duration::ZERO);
        assert_eq!(one.size, 1);
    }
}
