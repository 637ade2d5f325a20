//! What the bench consumer received: distinct messages of the current phase, duplicates, lateness.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Digits of the sequence number every bench payload starts with.
pub const SEQ_DIGITS: usize = 16;

/// A payload of `bytes` bytes (at least [`SEQ_DIGITS`]) that starts with `seq` in decimal.
pub fn payload(seq: u64, bytes: usize) -> Vec<u8> {
    let mut p = format!("{seq:0width$}", width = SEQ_DIGITS).into_bytes();
    p.resize(bytes.max(SEQ_DIGITS), b'.');
    p
}

/// The sequence number a bench payload starts with.
pub fn seq_of(payload: &[u8]) -> Option<u64> {
    std::str::from_utf8(payload.get(..SEQ_DIGITS)?)
        .ok()?
        .parse()
        .ok()
}

/// Wall-clock now in epoch microseconds (the bridge's due times are Redis `TIME`, same clock).
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Counts what the consumer saw for the sequence range of one phase.
#[derive(Default)]
pub struct Tally {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    lo: u64,
    seen: Vec<bool>,
    distinct: u64,
    duplicates: u64,
    /// (index in the phase, lateness) of every first delivery.
    late_us: Vec<(u64, i64)>,
}

/// A copy of the counts of the current phase.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Messages of the phase received more than once.
    pub duplicates: u64,
    /// Receive time minus due time of every first delivery, microseconds, sorted.
    pub late_us: Vec<i64>,
}

impl Tally {
    /// Starts a phase: only sequence numbers in `lo..lo + len` count from now on.
    pub fn reset(&self, lo: u64, len: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *s = State {
            lo,
            seen: vec![false; len as usize],
            late_us: Vec::with_capacity(len as usize),
            ..State::default()
        };
    }

    /// Records one received message (stragglers of earlier phases are ignored).
    pub fn record(&self, payload: &[u8], due_ms: Option<i64>, received_us: i64) {
        let Some(seq) = seq_of(payload) else { return };
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = seq.checked_sub(s.lo) else {
            return;
        };
        let Some(seen) = s.seen.get_mut(i as usize) else {
            return;
        };
        if std::mem::replace(seen, true) {
            s.duplicates += 1;
            return;
        }
        s.distinct += 1;
        if let Some(due) = due_ms {
            s.late_us.push((i, received_us - due * 1000));
        }
    }

    /// Distinct messages of the phase received so far.
    pub fn distinct(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .distinct
    }

    /// Distinct messages received so far among the phase's indexes `lo..hi`.
    pub fn distinct_in(&self, lo: u64, hi: u64) -> u64 {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let hi = (hi as usize).min(s.seen.len());
        let lo = (lo as usize).min(hi);
        s.seen[lo..hi].iter().filter(|&&b| b).count() as u64
    }

    /// The phase's counts; lateness of the messages whose index in the phase passes `select`, sorted.
    pub fn summary(&self, select: impl Fn(u64) -> bool) -> Summary {
        let mut out = {
            let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            Summary {
                duplicates: s.duplicates,
                late_us: s
                    .late_us
                    .iter()
                    .filter(|(i, _)| select(*i))
                    .map(|(_, l)| *l)
                    .collect(),
            }
        };
        out.late_us.sort_unstable();
        out
    }
}

/// The `q` quantile (0..=1) of sorted values, nearest rank; None when empty.
pub fn quantile(sorted: &[i64], q: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_carry_their_sequence_number() {
        let p = payload(42, 100);
        assert_eq!(p.len(), 100);
        assert_eq!(seq_of(&p), Some(42));
        assert_eq!(payload(7, 3).len(), SEQ_DIGITS);
        assert_eq!(seq_of(b"not a bench payload"), None);
    }

    #[test]
    fn only_the_current_phase_counts_and_duplicates_are_separate() {
        let t = Tally::default();
        t.reset(1000, 3);
        t.record(&payload(1000, 20), Some(5), 7000);
        t.record(&payload(1000, 20), Some(5), 9000);
        t.record(&payload(1002, 20), Some(5), 6000);
        t.record(&payload(999, 20), Some(5), 6000);
        t.record(&payload(1003, 20), None, 6000);
        let s = t.summary(|_| true);
        assert_eq!((t.distinct(), s.duplicates), (2, 1));
        assert_eq!(s.late_us, vec![1000, 2000]);
        assert_eq!(t.summary(|i| i == 2).late_us, vec![1000]);
    }

    #[test]
    fn quantiles_use_nearest_rank() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&v, 1.0), Some(100));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
