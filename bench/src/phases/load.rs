//! The phases under load: SIGKILLs mid-drain, lateness at a steady rate, many idle triggers,
//! and the bridge's memory with a large schedule.

use super::*;
use crate::process::Memory;

/// What one steady load measured, and the bridge's metrics and memory at its end.
pub(super) struct Steady {
    pub lateness: Lateness,
    /// The bridge's `/metrics` text.
    pub metrics: Option<String>,
    pub memory: Memory,
}

/// The bridge's empty claims, head reads and forwarded messages so far, over all its triggers.
async fn wake_counts(bridge: &BridgeProcess) -> Option<[u64; 3]> {
    wake_counts_in(&bridge.metrics().await?)
}

/// [`wake_counts`] from a scrape.
fn wake_counts_in(metrics: &str) -> Option<[u64; 3]> {
    let empty = metric_sum(metrics, "delay_bridge_empty_claims_total")?;
    let reads = metric_sum(metrics, "delay_bridge_head_reads_total")?;
    let forwarded = metric_sum(metrics, "delay_bridge_messages_forwarded_total")?;
    Some([empty as u64, reads as u64, forwarded as u64])
}

impl Bench {
    /// Drains `--crash-messages` due at once with the bench trigger's settings, SIGKILLing the
    /// bridge `--kills` times mid-drain and starting it again at once; the members a killed
    /// bridge held come back when their lease expires. Counts what arrived twice.
    pub(super) async fn crash(&self) -> anyhow::Result<Crash> {
        let n = self.args.crash_messages;
        let kills = self.args.kills;
        eprintln!("bench: crash, {n} messages, {kills} SIGKILLs");
        let staged = self.stage("crash", n).await?;
        let (key, mut conn) = (staged.key.clone(), self.conn.clone());
        let (mut bridge, _) = self
            .start_bridge("crash", std::slice::from_ref(&key), true)
            .await?;
        self.tally.reset(staged.base, n);
        let start = Instant::now();
        self.release(&staged).await?;
        let step = (n / (2 * u64::from(kills))).max(1);
        let mut mid_drain = 0;
        for k in 1..=kills {
            let target = (self.tally.distinct() + step).min(n);
            self.wait_received(target, budget(n)).await?;
            bridge.kill()?;
            if self.tally.distinct() < n {
                mid_drain += 1;
            }
            let log = self.dir.join(format!("crash-{k}.log"));
            bridge = bridge.respawn(&log)?;
            bridge.wait_ready(READY_TIMEOUT).await?;
        }
        // The killed bridges' claims come back after their lease.
        let end = Instant::now() + self.trigger.lease() + budget(n);
        self.wait_drained(&conn, std::slice::from_ref(&key), n, &bridge, end)
            .await?;
        let seconds = start.elapsed().as_secs_f64();
        // Copies still on their way from the broker.
        tokio::time::sleep(Duration::from_secs(1)).await;
        bridge.stop(STOP_TIMEOUT).await?;
        redis_ops::unlink_queue(&mut conn, &key).await?;
        let duplicates = self.tally.summary(|_| false).duplicates;
        Ok(Crash {
            messages: n,
            kills,
            kills_mid_drain: mid_drain,
            duplicates,
            duplicates_per_kill: duplicates as f64 / f64::from(kills),
            claimed_at_most: (self.trigger.workers()
                * delay_bridge::MAX_IN_FLIGHT
                * self.trigger.batch()) as u64,
            seconds,
        })
    }

    pub(super) async fn lateness(
        &self,
        notifications: bool,
        rate: u64,
    ) -> anyhow::Result<Lateness> {
        let key = self.new_key(if notifications {
            "steady"
        } else {
            "steady-off"
        });
        Ok(self.steady(&key, notifications, rate).await?.lateness)
    }

    /// The steady load, `rate` messages per second on `key` (which may hold members scheduled
    /// for later), with keyspace notifications on or off for its duration.
    pub(super) async fn steady(
        &self,
        key: &str,
        notifications: bool,
        rate: u64,
    ) -> anyhow::Result<Steady> {
        let mut conn = self.conn.clone();
        let flags = if notifications {
            delay_bridge::parts::redis::checks::with_needed_flags(&self.original_flags)
        } else {
            // Without the keyspace channel the bridge has no notifications, whatever else is set.
            self.original_flags.replace('K', "")
        };
        if flags != self.original_flags {
            redis_ops::set_notify_flags(&mut conn, &flags).await?;
        }
        let result = self.steady_load(key, notifications, rate).await;
        if flags != self.original_flags {
            redis_ops::set_notify_flags(&mut conn, &self.original_flags).await?;
        }
        result
    }

    async fn steady_load(
        &self,
        key: &str,
        notifications: bool,
        rate: u64,
    ) -> anyhow::Result<Steady> {
        let duration = self.args.duration;
        eprintln!(
            "bench: steady load, {rate} msg/s for {duration:?}, notifications {}",
            if notifications { "on" } else { "off" }
        );
        let keys = [key.to_string()];
        let (bridge, config) = self.start_bridge("steady", &keys, notifications).await?;
        let guard = config.triggers[0].guard_interval();
        let capacity = (rate as f64 * duration.as_secs_f64()).ceil() as u64 + rate;
        let base = self.next_base();
        self.tally.reset(base, capacity);
        let cpu_before = bridge.cpu_seconds()?;
        // The start-up's claims are not the load's.
        let counts_before = wake_counts(&bridge).await;
        let mut conn = self.conn.clone();
        let mut rng = rand::rngs::StdRng::from_entropy();
        let mut tick = tokio::time::interval(Duration::from_millis(2));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let start = Instant::now();
        let mut sent = 0u64;
        let mut early = vec![false; capacity as usize];
        let shape = self.args.shape();
        let queue = QueueKeys::derive(key)?;
        while start.elapsed() < duration {
            tick.tick().await;
            let target = ((rate as f64 * start.elapsed().as_secs_f64()) as u64).min(capacity);
            if target == sent {
                continue;
            }
            // One ZADD per message, as producers do: each is its own keyspace event.
            let mut pipe = redis::pipe();
            let now = now_ms();
            for seq in sent..target {
                let ahead = if rng.gen_bool(EARLY_SHARE) {
                    early[seq as usize] = true;
                    rng.gen_range(10..1000)
                } else {
                    rng.gen_range(1000..=5000)
                };
                shape.schedule(&mut pipe, &queue, key, base + seq, now + ahead);
            }
            pipe.query_async::<()>(&mut conn).await?;
            sent = target;
        }
        self.wait_received(sent, Duration::from_secs(35))
            .await
            .with_context(|| bridge.log_tail())?;
        let cpu = bridge.cpu_seconds()? - cpu_before;
        let metrics = bridge.metrics().await;
        let confirm_p99 = metrics.as_deref().and_then(|m| {
            histogram_bound(m, "delay_bridge_lateness_seconds", 0.99).map(|s| s * 1000.0)
        });
        let memory = bridge.memory()?;
        let empty_claims = match (counts_before, metrics.as_deref().and_then(wake_counts_in)) {
            (Some([e0, r0, f0]), Some([e1, r1, f1])) => Some(Wakes::new(e1 - e0, r1 - r0, f1 - f0)),
            _ => None,
        };
        bridge.stop(STOP_TIMEOUT).await?;
        redis_ops::unlink_queue(&mut conn, key).await?;
        let s = self.tally.summary(|_| true);
        let ms = |q: f64| quantile(&s.late_us, q).unwrap_or(0) as f64 / 1000.0;
        let e = self.tally.summary(|i| early[i as usize]);
        let lateness = Lateness {
            notifications,
            rate,
            messages: sent,
            duplicates: s.duplicates,
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            max_ms: ms(1.0),
            confirm_p99_le_ms: confirm_p99,
            early_messages: e.late_us.len() as u64,
            early_p99_ms: quantile(&e.late_us, 0.99).unwrap_or(0) as f64 / 1000.0,
            guard_interval_ms: guard.as_secs_f64() * 1000.0,
            cpu_seconds: cpu,
            empty_claims,
        };
        Ok(Steady {
            lateness,
            metrics,
            memory,
        })
    }

    pub(super) async fn idle(&self) -> anyhow::Result<Idle> {
        let triggers = self.args.idle_triggers;
        let window = self.args.idle_window;
        eprintln!("bench: idle, {triggers} triggers for {window:?}");
        let keys: Vec<String> = (0..triggers)
            .map(|i| self.new_key(&format!("idle-{i}")))
            .collect();
        let (bridge, _, startup) = self.start_bridge_timed("idle", &keys, true, false).await?;
        // Start-up (script loads, first claims, subscribing) is not the idle cost.
        tokio::time::sleep(IDLE_SETTLE).await;
        let mut conn = self.conn.clone();
        let counter = CommandCounter::start(&self.client).await;
        let total = |v: Option<String>| v.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let total_before =
            total(redis_ops::info_field(&mut conn, "stats", "total_commands_processed").await?);
        let cpu_before = bridge.cpu_seconds()?;
        tokio::time::sleep(window).await;
        let cpu = bridge.cpu_seconds()? - cpu_before;
        let memory = bridge.memory()?;
        let total_after =
            total(redis_ops::info_field(&mut conn, "stats", "total_commands_processed").await?);
        let counts = match counter {
            Ok(c) => Some(c.finish().await),
            Err(e) => {
                eprintln!("bench: MONITOR unavailable ({e}); counting every client's commands");
                None
            }
        };
        let ports = bridge.ports_to(self.redis_port);
        bridge.stop(STOP_TIMEOUT).await?;
        let (commands, attribution) = match counts {
            Some(counts) if !ports.is_empty() => {
                (ports.iter().filter_map(|p| counts.get(p)).sum(), "monitor")
            }
            // Without MONITOR or /proc: every client's commands, less the first INFO.
            _ => (total_after.saturating_sub(total_before + 1), "global"),
        };
        let secs = window.as_secs_f64();
        Ok(Idle {
            triggers,
            window_s: secs,
            commands,
            commands_per_s: commands as f64 / secs,
            commands_per_s_per_trigger: commands as f64 / secs / triggers as f64,
            attribution: attribution.into(),
            cpu_seconds: cpu,
            cpu_share: cpu / secs,
            startup_s: startup.as_secs_f64(),
            rss_bytes: memory.rss_bytes,
        })
    }

    pub(super) async fn big_rss(&self) -> anyhow::Result<Rss> {
        let n = self.args.big_messages;
        eprintln!("bench: RSS with {n} messages scheduled (loading)");
        let key = self.new_key("big");
        let mut conn = self.conn.clone();
        let later = now_ms() + 3_600_000;
        let base = self.next_base();
        redis_ops::load(&mut conn, &self.args.shape(), &key, &key, base, n, |_| {
            later
        })
        .await?;
        let (bridge, config) = self
            .start_bridge("big", std::slice::from_ref(&key), true)
            .await?;
        // Long enough for every periodic task (claims, recovery, backlog gauges) to have run.
        tokio::time::sleep(config.metrics.backlog_interval.max(Duration::from_secs(5))).await;
        let memory = bridge.memory()?;
        bridge.stop(STOP_TIMEOUT).await?;
        redis_ops::unlink_queue(&mut conn, &key).await?;
        Ok(Rss {
            scheduled: n,
            rss_bytes: memory.rss_bytes,
            peak_bytes: memory.peak_bytes,
        })
    }
}
