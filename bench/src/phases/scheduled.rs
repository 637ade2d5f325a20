//! The scheduled phase: the steady load on an empty trigger, then on one holding a large future
//! schedule (lateness, claim duration, bridge RSS), and Redis memory per scheduled member.

use futures_util::future::try_join_all;

use super::*;
use crate::report::{ScheduledRun, ScheduledSide};
use crate::shape::{PayloadArg, Shape};

/// Concurrent loaders: enough round trips in flight to keep Redis busy while the bench
/// formats the next payloads.
const LOADERS: u64 = 4;
/// The schedule starts this long after the steady load ends: none of it falls due while
/// anything is measured.
const SCHEDULE_MARGIN: Duration = Duration::from_secs(300);
/// The schedule ends this far ahead.
const SCHEDULE_SPAN: Duration = Duration::from_secs(24 * 3600);
/// How long freed sets may take to leave Redis's memory before a measurement.
const LAZYFREE_TIMEOUT: Duration = Duration::from_secs(300);

/// Messages per second falling due on the phase's trigger (whatever `--rate` says): the steady
/// load the schedule is judged beside.
const SCHEDULED_RATE: u64 = 1_000;

impl Bench {
    /// Runs the steady load on one empty trigger, then loads `--scheduled` members due over
    /// the next 24 hours into another queue and runs the same steady load on that trigger
    /// alone; measures Redis's memory per member in both payload modes.
    pub(super) async fn scheduled(&self, n: u64) -> anyhow::Result<ScheduledRun> {
        let mut conn = self.conn.clone();
        eprintln!("bench: scheduled, the steady load with nothing scheduled");
        let empty = self
            .scheduled_side(&self.new_key("sched-empty"), &mut conn)
            .await?;
        let shape = self.args.shape();
        let full_key = self.new_key("sched");
        eprintln!("bench: scheduled, loading {n} members over the next 24 hours");
        let (bytes, load_seconds) = self.load_schedule(&shape, &full_key, n).await?;
        eprintln!("bench: scheduled, the steady load beside {n} scheduled");
        // The schedule is unlinked after it (freed in the background, and waited for before
        // the next memory measurement).
        let full = self.scheduled_side(&full_key, &mut conn).await;
        // The steady load unlinks its key, but not when it failed.
        redis_ops::unlink_queue(&mut conn, &full_key).await?;
        let full = full?;
        let other = Shape {
            payload: match shape.payload {
                PayloadArg::Inline => PayloadArg::Hash,
                PayloadArg::Hash => PayloadArg::Inline,
            },
            ..shape
        };
        let other_key = self.new_key("sched-other");
        eprintln!(
            "bench: scheduled, loading {n} members in {} mode",
            other.label()
        );
        let (other_bytes, _) = self.load_schedule(&other, &other_key, n).await?;
        redis_ops::unlink_queue(&mut conn, &other_key).await?;
        let mut memory = vec![(shape.label(), bytes), (other.label(), other_bytes)];
        memory.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(ScheduledRun {
            scheduled: n,
            load_seconds,
            rate: SCHEDULED_RATE,
            empty,
            full,
            redis_bytes_per_member: memory,
        })
    }

    /// The steady load on the one trigger of `key`: its lateness, its claims as the bridge
    /// timed them, Redis's time per script call meanwhile, and the bridge's peak RSS.
    async fn scheduled_side(
        &self,
        key: &str,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> anyhow::Result<ScheduledSide> {
        let before = evalsha_stats(conn).await?;
        let run = self.steady(key, true, SCHEDULED_RATE).await?;
        let after = evalsha_stats(conn).await?;
        let calls = after.0.saturating_sub(before.0);
        let text = run.metrics.unwrap_or_default();
        let claim = "delay_bridge_claim_duration_seconds";
        Ok(ScheduledSide {
            lateness_p99_ms: run.lateness.p99_ms,
            claims: histogram_count(&text, claim).unwrap_or(0.0) as u64,
            claim_p99_ms: histogram_quantile(&text, claim, 0.99).map(|s| s * 1000.0),
            claim_mean_ms: histogram_mean(&text, claim).map(|s| s * 1000.0),
            evalsha_us_per_call: (calls > 0)
                .then(|| after.1.saturating_sub(before.1) as f64 / calls as f64),
            rss_bytes: run.memory.rss_bytes.max(run.memory.peak_bytes),
        })
    }

    /// Loads `n` members of `shape` on `key`, due evenly from a few minutes after the steady
    /// load to 24 hours ahead; returns Redis's memory per member and the seconds it took.
    async fn load_schedule(&self, shape: &Shape, key: &str, n: u64) -> anyhow::Result<(f64, f64)> {
        let mut conn = self.conn.clone();
        let before = settled_memory(&mut conn).await?;
        let from = now_ms() + (self.args.duration + SCHEDULE_MARGIN).as_millis() as i64;
        let span = SCHEDULE_SPAN.as_millis() as i64 - (from - now_ms());
        let due = move |i: u64| from + (i as i128 * span as i128 / n as i128) as i64;
        let base = self.next_base();
        let start = Instant::now();
        let share = n.div_ceil(LOADERS);
        let loads = (0..LOADERS).map(|l| {
            let (lo, hi) = ((l * share).min(n), ((l + 1) * share).min(n));
            let mut conn = self.conn.clone();
            async move {
                redis_ops::load(&mut conn, shape, key, key, base + lo, hi - lo, |i| {
                    due(lo + i)
                })
                .await
            }
        });
        try_join_all(loads).await?;
        let seconds = start.elapsed().as_secs_f64();
        let after = used_memory(&mut conn).await?;
        Ok((after.saturating_sub(before) as f64 / n as f64, seconds))
    }
}

/// `INFO memory` used_memory once no freed object waits for the background thread.
async fn settled_memory(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<u64> {
    let end = Instant::now() + LAZYFREE_TIMEOUT;
    loop {
        let pending = redis_ops::info_field(conn, "memory", "lazyfree_pending_objects").await?;
        if pending.as_deref().is_none_or(|p| p == "0") || Instant::now() >= end {
            return used_memory(conn).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<u64> {
    redis_ops::info_field(conn, "memory", "used_memory")
        .await?
        .and_then(|v| v.parse().ok())
        .context("INFO memory has no used_memory")
}

/// Calls and microseconds of `EVALSHA` so far (`INFO commandstats`, every client's).
async fn evalsha_stats(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<(u64, u64)> {
    let line = redis_ops::info_field(conn, "commandstats", "cmdstat_evalsha").await?;
    let field = |name: &str| {
        line.as_deref()?
            .split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    Ok((field("calls").unwrap_or(0), field("usec").unwrap_or(0)))
}

/// The buckets of a Prometheus histogram summed over its label sets: (upper bound, count).
fn buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    let mut out: Vec<(f64, f64)> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let le = series
            .split("le=\"")
            .nth(1)
            .and_then(|s| s.split('"').next());
        let le = match le {
            Some("+Inf") => f64::INFINITY,
            Some(v) => match v.parse() {
                Ok(v) => v,
                Err(_) => continue,
            },
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        match out.iter_mut().find(|(b, _)| *b == le) {
            Some((_, n)) => *n += value,
            None => out.push((le, value)),
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The `q` quantile of a histogram, interpolated linearly within its bucket (as Prometheus's
/// `histogram_quantile`); None without observations or when it falls in the `+Inf` bucket.
fn histogram_quantile(text: &str, name: &str, q: f64) -> Option<f64> {
    let buckets = buckets(text, name);
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, n) in buckets {
        if n >= rank {
            if le.is_infinite() {
                return None;
            }
            let inside = n - below;
            let share = if inside > 0.0 {
                (rank - below) / inside
            } else {
                1.0
            };
            return Some(lower + (le - lower) * share);
        }
        (lower, below) = (le, n);
    }
    None
}

/// A histogram's observations, summed over its label sets.
fn histogram_count(text: &str, name: &str) -> Option<f64> {
    metric_sum(text, &format!("{name}_count"))
}

/// A histogram's mean observation, over every label set.
fn histogram_mean(text: &str, name: &str) -> Option<f64> {
    let count = histogram_count(text, name)?;
    (count > 0.0).then_some(metric_sum(text, &format!("{name}_sum"))? / count)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP h x\n\
        h_bucket{trigger=\"a\",le=\"0.001\"} 50\n\
        h_bucket{trigger=\"a\",le=\"0.002\"} 90\n\
        h_bucket{trigger=\"a\",le=\"+Inf\"} 100\n\
        h_sum{trigger=\"a\"} 0.15\n\
        h_count{trigger=\"a\"} 100\n\
        h_bucket{trigger=\"b\",le=\"0.001\"} 50\n\
        h_bucket{trigger=\"b\",le=\"0.002\"} 100\n\
        h_bucket{trigger=\"b\",le=\"+Inf\"} 100\n\
        h_sum{trigger=\"b\"} 0.05\n\
        h_count{trigger=\"b\"} 100\n";

    #[test]
    fn quantiles_interpolate_within_the_bucket_summed_over_labels() {
        // 200 observations: 100 up to 1 ms, 190 up to 2 ms.
        let q = |q| histogram_quantile(TEXT, "h", q).unwrap();
        assert!((q(0.25) - 0.0005).abs() < 1e-12);
        assert!((q(0.725) - 0.0015).abs() < 1e-12);
        assert_eq!(histogram_quantile(TEXT, "h", 0.99), None);
        assert_eq!(histogram_quantile("", "h", 0.5), None);
    }

    #[test]
    fn means_and_counts_cover_every_label_set() {
        assert_eq!(histogram_count(TEXT, "h"), Some(200.0));
        assert!((histogram_mean(TEXT, "h").unwrap() - 0.001).abs() < 1e-12);
        assert_eq!(histogram_mean("", "h"), None);
    }
}
