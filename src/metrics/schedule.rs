//! The schedule metrics: missed ticks and each schedule's next fire, by trigger and schedule.

use prometheus::{GaugeVec, IntCounterVec};

use super::Make;

/// Handles to the schedule metrics, labelled by trigger and schedule (names from the config,
/// bounded like triggers).
#[derive(Clone)]
pub struct ScheduleMetrics {
    /// Ticks skipped or dropped under the misfire policy.
    pub missed: IntCounterVec,
    /// The next tick that fires, epoch seconds.
    pub next_fire: GaugeVec,
}

impl ScheduleMetrics {
    /// Creates and registers them.
    pub(super) fn new(make: &Make<'_>) -> Self {
        Self {
            missed: make.counter(
                "schedule_missed_ticks_total",
                "Ticks of a schedule skipped or dropped under its misfire policy",
                &["trigger", "schedule"],
            ),
            next_fire: make.float_gauge(
                "schedule_next_fire_timestamp_seconds",
                "When a schedule's next tick fires, epoch seconds",
                &["trigger", "schedule"],
            ),
        }
    }

    /// Makes the series of `schedule` of `trigger` exist (the counter at 0) and sets its next
    /// fire.
    pub fn start(&self, trigger: &str, schedule: &str, next_fire_ms: Option<i64>) {
        self.missed.with_label_values(&[trigger, schedule]);
        self.set_next(trigger, schedule, next_fire_ms);
    }

    /// Sets the next fire of `schedule` (`None`: none to come, shown as 0).
    pub fn set_next(&self, trigger: &str, schedule: &str, next_fire_ms: Option<i64>) {
        self.next_fire
            .with_label_values(&[trigger, schedule])
            .set(next_fire_ms.map_or(0.0, |ms| ms as f64 / 1000.0));
    }

    /// Removes the series of a schedule no longer run.
    pub fn remove(&self, trigger: &str, schedule: &str) {
        let _ = self.missed.remove_label_values(&[trigger, schedule]);
        let _ = self.next_fire.remove_label_values(&[trigger, schedule]);
    }
}
