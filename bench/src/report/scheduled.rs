//! The scheduled phase's figures (a large future schedule beside the steady load) and their lines.

use serde::Serialize;

use super::{mib, millis, verdict, Row, LATE_P99_MS};

/// Claim duration p99 with the schedule, at most this many times that without.
const CLAIM_GROWTH: f64 = 2.0;
/// Bridge RSS with the schedule, at most this many times that without (allocator noise).
const RSS_GROWTH: f64 = 1.1;

/// A bridge with one trigger under the steady load: an empty one, or one beside the schedule.
#[derive(Debug, Serialize)]
pub struct ScheduledSide {
    /// Lateness p99 of the trigger's messages, milliseconds.
    pub lateness_p99_ms: f64,
    /// Claim script calls of the trigger.
    pub claims: u64,
    /// 99th percentile of one claim call as the bridge timed it (its histogram, interpolated
    /// within the bucket), milliseconds.
    pub claim_p99_ms: Option<f64>,
    /// Mean claim call, milliseconds (the histogram's sum over its count).
    pub claim_mean_ms: Option<f64>,
    /// Redis's own time per `EVALSHA` meanwhile (`INFO commandstats`, every client's
    /// scripts), microseconds.
    pub evalsha_us_per_call: Option<f64>,
    /// The bridge's peak RSS.
    pub rss_bytes: u64,
}

/// What the scheduled phase measured.
#[derive(Debug, Serialize)]
pub struct ScheduledRun {
    /// Members scheduled over the next 24 hours.
    pub scheduled: u64,
    /// Seconds it took to load them.
    pub load_seconds: f64,
    /// Steady load on the trigger, messages per second.
    pub rate: u64,
    /// The trigger with nothing scheduled.
    pub empty: ScheduledSide,
    /// The trigger holding the schedule, under the same load.
    pub full: ScheduledSide,
    /// Redis `used_memory` growth per scheduled member, bytes, by shape (`inline/raw`, ...).
    pub redis_bytes_per_member: Vec<(String, f64)>,
}

impl ScheduledRun {
    /// The report's lines.
    pub fn rows(&self) -> Vec<Row> {
        let (e, f, n) = (&self.empty, &self.full, self.scheduled);
        let ms = |v: Option<f64>| v.map_or("?".into(), |v| format!("{v:.3} ms"));
        let mut rows = vec![Row {
            ceiling: format!("{:.0} members/s", n as f64 / self.load_seconds.max(1e-9)),
            ..Row::shown(
                format!("scheduled: {n} members over 24 h loaded"),
                format!("{:.1} s", self.load_seconds),
            )
        }];
        let lateness = format!(
            "lateness p99 with {n} scheduled ({} msg/s; ceiling: same load, nothing scheduled)",
            self.rate
        );
        rows.push(Row {
            ceiling: millis(e.lateness_p99_ms),
            ..Row::judged(
                lateness,
                millis(f.lateness_p99_ms),
                format!("<= {LATE_P99_MS} ms"),
                f.lateness_p99_ms <= LATE_P99_MS,
            )
        });
        let growth = match (f.claim_p99_ms, e.claim_p99_ms) {
            (Some(f), Some(e)) if e > 0.0 => Some(f / e),
            _ => None,
        };
        rows.push(Row {
            measurement: format!(
                "claim duration p99 with {n} scheduled vs nothing scheduled ({} / {} claims)",
                f.claims, e.claims
            ),
            bridge: ms(f.claim_p99_ms),
            ceiling: ms(e.claim_p99_ms),
            ratio: growth.map_or(String::new(), |g| format!("{g:.2}x")),
            goal: format!("<= {CLAIM_GROWTH}x empty"),
            result: verdict(growth.is_some_and(|g| g <= CLAIM_GROWTH)),
        });
        let us = |v: Option<f64>| v.map_or("?".into(), |v| format!("{v:.1} us"));
        rows.push(Row {
            ceiling: ms(e.claim_mean_ms),
            ..Row::shown(
                "  claim duration mean (bridge histogram)",
                ms(f.claim_mean_ms),
            )
        });
        rows.push(Row {
            ceiling: us(e.evalsha_us_per_call),
            ..Row::shown(
                "  redis time per EVALSHA meanwhile (every client)",
                us(f.evalsha_us_per_call),
            )
        });
        let (with, without) = (f.rss_bytes, e.rss_bytes);
        rows.push(Row {
            measurement: format!("bridge peak RSS with {n} scheduled (ceiling: none)"),
            bridge: mib(with),
            ceiling: mib(without),
            ratio: format!("{:.2}x", with as f64 / without.max(1) as f64),
            goal: format!("<= {RSS_GROWTH}x none scheduled"),
            result: verdict(with as f64 <= RSS_GROWTH * without as f64),
        });
        rows.extend(self.redis_bytes_per_member.iter().map(|(shape, bytes)| {
            Row::shown(
                format!("redis memory per scheduled member ({shape})"),
                format!("{bytes:.0} B"),
            )
        }));
        rows
    }
}
