//! The last hour of each trigger's rates, backlog and lateness, sampled every 10 s for the console.
//!
//! A sample reads the counters and gauges the metrics already keep (nothing is counted
//! twice): forwarded and dead-lettered totals, the due backlog, and the lateness histogram's
//! buckets. Rates and lateness percentiles are over the 10 s since the sample before.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::core::Collector;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::AdminTriggers;
use crate::metrics::Metrics;

/// Time between two samples.
pub(super) const INTERVAL: Duration = Duration::from_secs(10);
/// Samples kept per trigger: one hour.
pub(super) const SAMPLES: usize = 360;
/// Samples over which the table's lateness p99 is taken: one minute.
const RECENT: usize = 6;

/// One 10 s window of a trigger.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct Point {
    /// End of the window, epoch ms (the bridge's clock, to the second).
    pub at_ms: i64,
    /// Messages forwarded per second over the window.
    pub forwarded_per_second: f32,
    /// Messages dead-lettered per second over the window.
    pub dead_lettered_per_second: f32,
    /// Due members at the end of the window.
    pub due: i64,
    /// Median lateness of the messages confirmed in the window (upper bound of its
    /// histogram bucket); `None` when none were.
    pub lateness_p50_seconds: Option<f32>,
    /// 99th percentile, as the median.
    pub lateness_p99_seconds: Option<f32>,
}

/// A [`Point`] as kept: 24 bytes (seconds, `f32`s, NaN for no lateness), so that an hour of
/// a trigger is about 9 KiB.
#[derive(Debug, Clone, Copy)]
struct Slot {
    at_s: u32,
    forwarded: f32,
    dead_lettered: f32,
    due: u32,
    p50: f32,
    p99: f32,
}

impl Slot {
    fn point(&self) -> Point {
        let some = |v: f32| (!v.is_nan()).then_some(v);
        Point {
            at_ms: i64::from(self.at_s) * 1000,
            forwarded_per_second: self.forwarded,
            dead_lettered_per_second: self.dead_lettered,
            due: i64::from(self.due),
            lateness_p50_seconds: some(self.p50),
            lateness_p99_seconds: some(self.p99),
        }
    }
}

/// The cumulative values a sample reads.
#[derive(Debug, Clone, Default, PartialEq)]
struct Reading {
    at_ms: i64,
    forwarded: u64,
    dead_lettered: u64,
    /// Cumulative counts of the lateness buckets, in order of their upper bounds.
    lateness: Vec<u64>,
}

/// One trigger's points and its last readings (for the deltas).
struct Track {
    points: VecDeque<Slot>,
    /// The last [`RECENT`] + 1 readings, oldest first.
    readings: VecDeque<Reading>,
}

/// Every trigger's last hour.
#[derive(Clone, Default)]
pub(crate) struct History {
    tracks: Arc<Mutex<BTreeMap<String, Track>>>,
    /// The lateness buckets' upper bounds, as the histogram has them.
    bounds: Arc<Mutex<Vec<f64>>>,
}

/// The upper bound of the bucket in which the `q` quantile of `deltas` (per-bucket counts,
/// cumulative) falls; the last finite bound for the overflow bucket; `None` without counts.
fn quantile(bounds: &[f64], deltas: &[u64], q: f64) -> Option<f32> {
    let total = *deltas.last()?;
    if total == 0 {
        return None;
    }
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let i = deltas.iter().position(|c| *c >= rank)?;
    let finite = bounds.iter().copied().filter(|b| b.is_finite());
    let bound = match bounds.get(i) {
        Some(b) if b.is_finite() => *b,
        _ => finite.fold(0.0, f64::max),
    };
    Some(bound as f32)
}

fn deltas(new: &[u64], old: &[u64]) -> Vec<u64> {
    new.iter()
        .enumerate()
        .map(|(i, n)| n.saturating_sub(old.get(i).copied().unwrap_or(0)))
        .collect()
}

impl History {
    /// Adds a reading of `trigger`: a point for the window since its previous reading.
    fn record(&self, trigger: &str, r: Reading, due: i64) {
        let bounds = self
            .bounds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut tracks = self.tracks.lock().unwrap_or_else(|e| e.into_inner());
        let track = tracks.entry(trigger.to_string()).or_insert_with(|| Track {
            points: VecDeque::with_capacity(SAMPLES + 1),
            readings: VecDeque::with_capacity(RECENT + 2),
        });
        if let Some(prev) = track.readings.back() {
            let seconds = ((r.at_ms - prev.at_ms) as f64 / 1000.0).max(0.001);
            let rate = |n: u64, p: u64| (n.saturating_sub(p) as f64 / seconds) as f32;
            let window = deltas(&r.lateness, &prev.lateness);
            track.points.push_back(Slot {
                at_s: u32::try_from(r.at_ms / 1000).unwrap_or(u32::MAX),
                forwarded: rate(r.forwarded, prev.forwarded),
                dead_lettered: rate(r.dead_lettered, prev.dead_lettered),
                due: u32::try_from(due.max(0)).unwrap_or(u32::MAX),
                p50: quantile(&bounds, &window, 0.5).unwrap_or(f32::NAN),
                p99: quantile(&bounds, &window, 0.99).unwrap_or(f32::NAN),
            });
            if track.points.len() > SAMPLES {
                track.points.pop_front();
            }
        }
        track.readings.push_back(r);
        if track.readings.len() > RECENT + 1 {
            track.readings.pop_front();
        }
    }

    /// The points of `trigger` over the last `window`, oldest first.
    pub(crate) fn points(&self, trigger: &str, window: Duration) -> Vec<Point> {
        let n = (window.as_millis() / INTERVAL.as_millis()) as usize;
        let tracks = self.tracks.lock().unwrap_or_else(|e| e.into_inner());
        let Some(track) = tracks.get(trigger) else {
            return Vec::new();
        };
        let skip = track.points.len().saturating_sub(n);
        track.points.iter().skip(skip).map(Slot::point).collect()
    }

    /// The 99th percentile of `trigger`'s lateness over the last minute (the readings of the
    /// last [`RECENT`] windows); `None` when nothing was confirmed.
    pub(crate) fn recent_p99(&self, trigger: &str) -> Option<f32> {
        let bounds = self
            .bounds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let tracks = self.tracks.lock().unwrap_or_else(|e| e.into_inner());
        let track = tracks.get(trigger)?;
        let (first, last) = (track.readings.front()?, track.readings.back()?);
        quantile(&bounds, &deltas(&last.lateness, &first.lateness), 0.99)
    }

    /// Takes one sample of every trigger served, and forgets the triggers no longer served.
    fn sample(&self, triggers: &AdminTriggers, metrics: &Metrics) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        // The lateness series that exist, by trigger: reading them this way makes none.
        let mut lateness: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for family in metrics.lateness.collect() {
            for m in family.get_metric() {
                let Some(label) = m.get_label().iter().find(|l| l.name() == "trigger") else {
                    continue;
                };
                let h = m.get_histogram();
                let buckets = h.get_bucket();
                {
                    let mut bounds = self.bounds.lock().unwrap_or_else(|e| e.into_inner());
                    if bounds.is_empty() {
                        *bounds = buckets.iter().map(|b| b.upper_bound()).collect();
                        bounds.push(f64::INFINITY);
                    }
                }
                let mut counts: Vec<u64> = buckets.iter().map(|b| b.cumulative_count()).collect();
                counts.push(h.get_sample_count());
                lateness.insert(label.value().to_string(), counts);
            }
        }
        // Nothing is served while the bridge is starting.
        let Ok(served) = triggers.now() else {
            return;
        };
        for (name, t) in served.iter() {
            let cells = metrics.triggers.cells(name, t.config.sink());
            let dead_lettered = cells.dead_lettered.total();
            let reading = Reading {
                at_ms: now,
                forwarded: cells.forwarded.load(Relaxed),
                dead_lettered,
                lateness: lateness.remove(name).unwrap_or_default(),
            };
            self.record(name, reading, cells.backlog[0].load(Relaxed));
        }
        self.tracks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|name, _| served.contains_key(name));
    }

    /// Samples every [`INTERVAL`] until `stop`, the first as soon as triggers are served.
    pub(crate) fn spawn(
        &self,
        triggers: AdminTriggers,
        metrics: Metrics,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                // Until the bridge serves its triggers, look again soon: the first sample is
                // the baseline of the first window.
                while triggers.now().map_or(true, |t| t.is_empty()) {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                    }
                    tick.reset();
                }
                me.sample(&triggers, &metrics);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(at_ms: i64, forwarded: u64, lateness: Vec<u64>) -> Reading {
        Reading {
            at_ms,
            forwarded,
            dead_lettered: 0,
            lateness,
        }
    }

    #[test]
    fn points_are_rates_and_percentiles_of_each_window_and_the_ring_keeps_an_hour() {
        let h = History::default();
        *h.bounds.lock().unwrap() = vec![0.01, 0.1, 1.0, f64::INFINITY];
        h.record("t", reading(0, 0, vec![0, 0, 0, 0]), 0);
        // 100 confirmed in 10 s: 98 within 10 ms, 2 between 0.1 and 1 s.
        h.record("t", reading(10_000, 100, vec![98, 98, 100, 100]), 5);
        let p = h.points("t", Duration::from_secs(900));
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].forwarded_per_second, 10.0);
        assert_eq!(p[0].due, 5);
        assert_eq!(p[0].lateness_p50_seconds, Some(0.01));
        assert_eq!(p[0].lateness_p99_seconds, Some(1.0));
        // A window with nothing confirmed has no percentiles; the overflow bucket shows the
        // last finite bound.
        h.record("t", reading(20_000, 100, vec![98, 98, 100, 100]), 0);
        assert_eq!(h.points("t", INTERVAL)[0].lateness_p99_seconds, None);
        h.record("t", reading(30_000, 101, vec![98, 98, 100, 101]), 0);
        assert_eq!(h.points("t", INTERVAL)[0].lateness_p99_seconds, Some(1.0));
        for i in 4..400 {
            h.record("t", reading(i * 10_000, 101, vec![98, 98, 100, 101]), 0);
        }
        assert_eq!(h.points("t", Duration::from_secs(3600)).len(), SAMPLES);
        assert_eq!(std::mem::size_of::<Slot>(), 24);
        assert_eq!(h.points("t", Duration::from_secs(900)).len(), 90);
        // The last minute saw nothing new.
        assert_eq!(h.recent_p99("t"), None);
        assert_eq!(h.recent_p99("other"), None);
    }
}
