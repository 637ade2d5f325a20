//! The scheduled phase's figures (a large future schedule beside the steady load) and their lines.

use serde::Serialize;

use super::{mib, verdict, Lateness, Row, LATE_P99_MS};

/// Claim duration p99 with the schedule, at most this many times that without.
const CLAIM_GROWTH: f64 = 2.0;
/// Bridge RSS with the schedule, at most this many times that without (allocator noise).
const RSS_GROWTH: f64 = 1.1;

/// The steady load on one trigger, with or without a schedule in its future.
#[derive(Debug, Serialize)]
pub struct ScheduledSide {
    /// Lateness of the steady load.
    pub lateness: Lateness,
    /// Claim script calls of the bridge.
    pub claims: u64,
    /// 99th percentile of one claim call as the bridge timed it (its histogram, interpolated
    /// within the bucket), milliseconds.
    pub claim_p99_ms: Option<f64>,
    /// Mean claim call, milliseconds (the histogram's sum over its count).
    pub claim_mean_ms: Option<f64>,
    /// Redis's own time per `EVALSHA` meanwhile (`INFO commandstats`, every client's scripts),
    /// microseconds.
    pub evalsha_us_per_call: Option<f64>,
    /// Bridge VmRSS at the end of the load.
    pub rss_bytes: u64,
    /// Bridge VmHWM at the same moment.
    pub peak_bytes: u64,
}

/// What the scheduled phase measured.
#[derive(Debug, Serialize)]
pub struct ScheduledRun {
    /// Members scheduled over the next 24 hours.
    pub scheduled: u64,
    /// Seconds it took to load them.
    pub load_seconds: f64,
    /// The steady load with nothing scheduled later.
    pub empty: ScheduledSide,
    /// The same with the schedule in the same trigger.
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
            measurement: format!("scheduled: {n} members over 24 h loaded"),
            bridge: format!("{:.1} s", self.load_seconds),
            ceiling: format!("{:.0} members/s", n as f64 / self.load_seconds.max(1e-9)),
            ..Row::default()
        }];
        rows.push(Row {
            measurement: format!(
                "lateness p99 with {n} scheduled ({} msgs; ceiling: none scheduled)",
                f.lateness.messages
            ),
            bridge: format!("{:.1} ms", f.lateness.p99_ms),
            ceiling: format!("{:.1} ms", e.lateness.p99_ms),
            goal: format!("<= {LATE_P99_MS} ms"),
            result: verdict(f.lateness.p99_ms <= LATE_P99_MS),
            ..Row::default()
        });
        let growth = match (f.claim_p99_ms, e.claim_p99_ms) {
            (Some(f), Some(e)) if e > 0.0 => Some(f / e),
            _ => None,
        };
        rows.push(Row {
            measurement: format!(
                "claim duration p99 with {n} scheduled ({} / {} claims)",
                f.claims, e.claims
            ),
            bridge: ms(f.claim_p99_ms),
            ceiling: ms(e.claim_p99_ms),
            ratio: growth.map_or(String::new(), |g| format!("{g:.2}x")),
            goal: format!("<= {CLAIM_GROWTH}x none scheduled"),
            result: verdict(growth.is_some_and(|g| g <= CLAIM_GROWTH)),
        });
        rows.push(Row {
            measurement: "  claim duration mean (bridge histogram)".into(),
            bridge: ms(f.claim_mean_ms),
            ceiling: ms(e.claim_mean_ms),
            ..Row::default()
        });
        if let (Some(fu), Some(eu)) = (f.evalsha_us_per_call, e.evalsha_us_per_call) {
            rows.push(Row {
                measurement: "  redis time per EVALSHA (INFO commandstats, every client)".into(),
                bridge: format!("{fu:.1} us"),
                ceiling: format!("{eu:.1} us"),
                ratio: format!("{:.2}x", fu / eu.max(1e-9)),
                ..Row::default()
            });
        }
        let rss = |s: &ScheduledSide| s.rss_bytes.max(s.peak_bytes);
        rows.push(Row {
            measurement: format!("bridge RSS with {n} scheduled (peak)"),
            bridge: mib(rss(f)),
            ceiling: mib(rss(e)),
            ratio: format!("{:.2}x", rss(f) as f64 / rss(e).max(1) as f64),
            goal: format!("<= {RSS_GROWTH}x none scheduled"),
            result: verdict(rss(f) as f64 <= RSS_GROWTH * rss(e) as f64),
        });
        for (shape, bytes) in &self.redis_bytes_per_member {
            rows.push(Row {
                measurement: format!("redis memory per scheduled member ({shape})"),
                bridge: format!("{bytes:.0} B"),
                ..Row::default()
            });
        }
        rows
    }
}
