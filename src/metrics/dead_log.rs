//! Dead letters logged by the burst: per trigger at most one line per reason a second, with
//! the count, a sample member and the sample's detail, instead of one line per letter.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::Instrument;

/// Shortest gap between two lines of one trigger.
const GAP: Duration = Duration::from_secs(1);
/// Longest sample member or detail written, in characters.
const MOST_CHARS: usize = 200;

/// One reason's letters since the last line.
struct Burst {
    count: u64,
    sample: String,
    detail: Option<String>,
}

#[derive(Default)]
struct State {
    /// Letters not logged yet, by reason.
    pending: BTreeMap<String, Burst>,
    /// When the last lines were written.
    last: Option<Instant>,
    /// A task will write the pending letters at the end of the gap.
    flush_scheduled: bool,
}

/// One trigger's dead letters not logged yet (cheap to clone).
#[derive(Clone)]
pub(super) struct DeadLetterLog {
    trigger: Arc<str>,
    state: Arc<Mutex<State>>,
}

impl DeadLetterLog {
    pub(super) fn new(trigger: &str) -> Self {
        Self {
            trigger: trigger.into(),
            state: Arc::default(),
        }
    }

    /// `member` was dead-lettered for `reason`: written at once if the trigger wrote no
    /// line in the last second, else counted and written with the rest at the gap's end.
    pub(super) fn dead_lettered(&self, member: &[u8], reason: &str, detail: Option<&str>) {
        let mut state = self.lock();
        let burst = state
            .pending
            .entry(reason.to_string())
            .or_insert_with(|| Burst {
                count: 0,
                sample: bounded(&String::from_utf8_lossy(member)),
                detail: detail.map(bounded),
            });
        burst.count += 1;
        let now = Instant::now();
        let wait = state.last.map_or(Duration::ZERO, |last| {
            GAP.saturating_sub(now.duration_since(last))
        });
        if wait.is_zero() {
            self.write(&mut state, now);
        } else if !state.flush_scheduled {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    state.flush_scheduled = true;
                    let log = self.clone();
                    // In the caller's span: the line names the worker, like the first.
                    let flush = async move {
                        tokio::time::sleep(wait).await;
                        let mut state = log.lock();
                        state.flush_scheduled = false;
                        log.write(&mut state, Instant::now());
                    };
                    runtime.spawn(flush.instrument(tracing::Span::current()));
                }
                // No runtime to wait on: write now rather than hold the letters.
                Err(_) => self.write(&mut state, now),
            }
        }
    }

    /// Writes one line per pending reason.
    fn write(&self, state: &mut State, now: Instant) {
        if state.pending.is_empty() {
            return;
        }
        state.last = Some(now);
        for (reason, burst) in std::mem::take(&mut state.pending) {
            tracing::warn!(
                trigger = %self.trigger,
                reason,
                count = burst.count,
                sample = %burst.sample,
                detail = burst.detail.as_deref().unwrap_or(""),
                "messages dead-lettered"
            );
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Counts only: nothing half-updated matters after a panic elsewhere.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `text` cut to [`MOST_CHARS`] characters, marked when cut.
fn bounded(text: &str) -> String {
    crate::shorten::shorten(text, MOST_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_samples_are_cut() {
        assert_eq!(bounded("abc"), "abc");
        let long = "é".repeat(500);
        let cut = bounded(&long);
        assert_eq!(cut.chars().count(), MOST_CHARS + 3);
        assert!(cut.ends_with("..."));
    }
}
