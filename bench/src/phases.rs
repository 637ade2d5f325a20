//! The bench phases: ceilings, forwarding a backlog, lateness under steady load, idle cost, memory.

use std::time::Duration;

use anyhow::{bail, Context};
use delay_bridge::config::Config;
use delay_bridge::keys::QueueKeys;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::ceiling::{Ceiling, Window};
use super::process::{free_port, histogram_bound, BridgeProcess};
use super::redis_ops::{self, CommandCounter};
use super::report::{
    Crash, Forward, Idle, Lateness, Machine, PhaseError, Rate, Report, Rss, Settings,
};
use super::tally::quantile;
use super::{Bench, BridgeToml, Phase};

/// How long the bridge may take to connect to Redis and the broker.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the idle bridge runs before its cost is counted: its start (first claims,
/// subscribing, first gauges) is not idle cost.
const IDLE_SETTLE: Duration = Duration::from_secs(5);
/// How long a stopping bridge may take to drain.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// How often completion is checked (the resolution of the measured times).
const POLL: Duration = Duration::from_millis(2);
/// Share of the steady load scheduled earlier than the queue head (10 ms to 1 s ahead).
const EARLY_SHARE: f64 = 0.1;

/// The queue nobody consumes held `purged` messages after `n` were sent: at least `n`
/// (more only if a lost confirm made the bridge send one twice).
fn check_backlog(purged: u64, n: u64) -> anyhow::Result<()> {
    anyhow::ensure!(
        purged >= n,
        "the queue nobody consumes held {purged} of {n} messages"
    );
    Ok(())
}

fn now_ms() -> i64 {
    super::tally::now_us() / 1000
}

/// A queue loaded beside its key by [`Bench::stage`], waiting for [`Bench::release`].
struct Staged {
    key: String,
    staging: String,
    /// Sequence number of the first member.
    base: u64,
    n: u64,
    /// Due time of every member, epoch ms.
    due: i64,
}

/// Time allowed for moving `n` messages: generous, so only a stall fails a phase.
fn budget(n: u64) -> Duration {
    Duration::from_secs(60) + Duration::from_millis(n)
}

impl Bench {
    /// Runs every phase not skipped, recording results and failures in `report`.
    pub(super) async fn run_phases(&self, report: &mut Report) {
        let mut conn = self.conn.clone();
        report.machine = Machine {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model: std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|c| {
                    c.lines()
                        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                        .map(|(_, m)| m.trim().to_string())
                })
                .unwrap_or_default(),
            redis_version: redis_ops::info_field(&mut conn, "server", "redis_version")
                .await
                .ok()
                .flatten()
                .unwrap_or_default(),
        };
        report.settings = Settings {
            sink: format!("{:?}", self.args.sink).to_lowercase(),
            messages: self.args.messages,
            payload_bytes: self.args.payload_bytes,
            shape: self.args.shape().label(),
            workers: self.trigger.workers,
            batch: self.trigger.batch,
            rate: self.args.rate,
            duration_s: self.args.duration.as_secs_f64(),
        };
        let run = |p: Phase| !self.args.skip.contains(&p);
        let mut errors = Vec::new();
        let mut fail = |phase: &str, e: anyhow::Error| {
            eprintln!("bench: {phase} failed: {e:#}");
            errors.push(PhaseError {
                phase: phase.into(),
                error: format!("{e:#}"),
            });
        };
        if run(Phase::Broker) {
            match self.broker_ceiling().await {
                Ok(r) => report.broker_ceiling = Some(r),
                Err(e) => fail("broker", e),
            }
        }
        if run(Phase::Redis) {
            match self.redis_ceiling().await {
                Ok(r) => report.redis_ceiling = Some(r),
                Err(e) => fail("redis", e),
            }
        }
        if !self.args.redis_cluster.is_empty() {
            match self.cluster().await {
                Ok(r) => report.cluster = Some(r),
                Err(e) => fail("cluster", e),
            }
        }
        if run(Phase::Forward) {
            match self.drain(false).await {
                Ok(r) => report.forward = Some(r),
                Err(e) => fail("forward", e),
            }
        }
        if run(Phase::Backlog) && self.backlog_destination.is_some() {
            match self.backlog_ceiling().await {
                Ok(r) => report.backlog_ceiling = Some(r),
                Err(e) => fail("backlog ceiling", e),
            }
            match self.drain(true).await {
                Ok(r) => report.backlog = Some(r),
                Err(e) => fail("backlog", e),
            }
        }
        if run(Phase::Lateness) {
            let modes: &[bool] = if self.args.no_notify {
                &[true, false]
            } else {
                &[true]
            };
            for &on in modes {
                match self.lateness(on).await {
                    Ok(r) => report.lateness.push(r),
                    Err(e) => fail(if on { "lateness" } else { "lateness-no-notify" }, e),
                }
            }
        }
        if run(Phase::Idle) {
            match self.idle().await {
                Ok(r) => report.idle = Some(r),
                Err(e) => fail("idle", e),
            }
        }
        if run(Phase::Crash) {
            match self.crash().await {
                Ok(r) => report.crash = Some(r),
                Err(e) => fail("crash", e),
            }
        }
        if run(Phase::Ingress) {
            match self.ingress().await {
                Ok(r) => report.ingress = r,
                Err(e) => fail("ingress", e),
            }
        }
        if self.args.big {
            match self.big_rss().await {
                Ok(r) => report.rss = Some(r),
                Err(e) => fail("rss", e),
            }
        }
        report.errors = errors;
    }

    /// Starts a bridge with one trigger per key and waits until it is ready.
    async fn start_bridge(
        &self,
        name: &str,
        keys: &[String],
        notifications: bool,
    ) -> anyhow::Result<(BridgeProcess, Config)> {
        self.start_bridge_to(name, keys, notifications, false).await
    }

    /// [`Self::start_bridge`], with `backlog` publishing to the queue nobody consumes.
    async fn start_bridge_to(
        &self,
        name: &str,
        keys: &[String],
        notifications: bool,
        backlog: bool,
    ) -> anyhow::Result<(BridgeProcess, Config)> {
        let (bridge, config, _) = self
            .start_bridge_timed(name, keys, notifications, backlog)
            .await?;
        Ok((bridge, config))
    }

    /// [`Self::start_bridge_to`], also returning how long the bridge took from its spawn to
    /// ready.
    async fn start_bridge_timed(
        &self,
        name: &str,
        keys: &[String],
        notifications: bool,
        backlog: bool,
    ) -> anyhow::Result<(BridgeProcess, Config, Duration)> {
        let port = free_port()?;
        let (path, config) = BridgeToml {
            args: &self.args,
            broker: &self.broker,
            keys,
            notifications,
            metrics_port: port,
            backlog,
            cluster: &[],
            shards: 1,
        }
        .write(&self.dir, name)?;
        let log = self.dir.join(format!("{name}.log"));
        let mut bridge = BridgeProcess::spawn(&self.bridge, &path, port, &log)?;
        let took = bridge.wait_ready(READY_TIMEOUT).await?;
        Ok((bridge, config, took))
    }

    /// Waits until the consumer holds `expected` distinct messages of the current phase and
    /// every queue of `keys` is empty; fails at `end` with what arrived and the bridge's log.
    pub(super) async fn wait_drained<C>(
        &self,
        conn: &C,
        keys: &[String],
        expected: u64,
        bridge: &BridgeProcess,
        end: Instant,
    ) -> anyhow::Result<()>
    where
        C: redis::aio::ConnectionLike + Clone,
    {
        loop {
            if self.tally.distinct() >= expected {
                let mut left = 0;
                for key in keys {
                    left += redis_ops::queue_len(&mut conn.clone(), key).await?;
                }
                if left == 0 {
                    return Ok(());
                }
            }
            if Instant::now() >= end {
                bail!(
                    "the consumer received {} of {expected} and Redis still held messages; {}",
                    self.tally.distinct(),
                    bridge.log_tail()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until the consumer holds `n` distinct messages of the current phase.
    async fn wait_received(&self, n: u64, timeout: Duration) -> anyhow::Result<()> {
        let end = Instant::now() + timeout;
        while self.tally.distinct() < n {
            if Instant::now() >= end {
                bail!(
                    "the consumer received {} of {n} messages within {timeout:?}",
                    self.tally.distinct()
                );
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    async fn broker_ceiling(&self) -> anyhow::Result<Rate> {
        let n = self.args.messages;
        eprintln!("bench: broker ceiling, {n} messages");
        let window = |base, count| Window {
            key: "delay-bridge-bench:ceiling".into(),
            base,
            count,
            payload_bytes: self.args.payload_bytes,
            due_ms: now_ms(),
            batch: self.trigger.batch,
        };
        // One publisher per worker, connected before anything is timed.
        let ceiling = Ceiling::connect(
            &self.sink,
            &self.destination,
            self.trigger.workers,
            self.trigger.publish_timeout,
        )
        .await?;
        let timed = async {
            // A first round trip outside the timing: the consumer's first fetch and the
            // broker's first writes to a new queue or topic are not the broker's rate.
            let warm = n.min(1000);
            let base = self.next_base();
            self.tally.reset(base, warm);
            ceiling.publish(&window(base, warm)).await?;
            self.wait_received(warm, budget(warm)).await?;
            let base = self.next_base();
            self.tally.reset(base, n);
            let start = ceiling.publish(&window(base, n)).await?;
            self.wait_received(n, budget(n)).await?;
            Ok(Rate::new(n, start.elapsed().as_secs_f64()))
        }
        .await;
        ceiling.close().await;
        timed
    }

    async fn redis_ceiling(&self) -> anyhow::Result<Rate> {
        let n = self.args.messages;
        eprintln!("bench: redis ceiling, {n} messages");
        let key = self.new_key("claim");
        let mut conn = self.conn.clone();
        let due = now_ms() - 1000;
        let base = self.next_base();
        let shape = self.args.shape();
        redis_ops::load(&mut conn, &shape, &key, &key, base, n, |_| due).await?;
        let cm = delay_bridge::redis_conn::Conn::open(&self.args.redis_url).await?;
        let start = Instant::now();
        let claimed =
            redis_ops::claim_ceiling(cm, &key, &shape, self.trigger.workers, self.trigger.batch)
                .await?;
        let secs = start.elapsed().as_secs_f64();
        redis_ops::unlink_queue(&mut conn, &key).await?;
        if claimed != n {
            bail!("claimed {claimed} of {n} members");
        }
        Ok(Rate::new(n, secs))
    }

    /// A plain publisher filling the queue nobody consumes: done when the broker confirmed
    /// every message, as the bridge is done when Redis is empty.
    async fn backlog_ceiling(&self) -> anyhow::Result<Rate> {
        let n = self.args.messages;
        let destination = self.backlog_destination.as_ref().context("AMQP only")?;
        eprintln!("bench: backlog ceiling, {n} messages into a queue nobody consumes");
        let ceiling = Ceiling::connect(
            &self.sink,
            destination,
            self.trigger.workers,
            self.trigger.publish_timeout,
        )
        .await?;
        let window = Window {
            key: "delay-bridge-bench:backlog-ceiling".into(),
            base: self.next_base(),
            count: n,
            payload_bytes: self.args.payload_bytes,
            due_ms: now_ms(),
            batch: self.trigger.batch,
        };
        let timed = async {
            let start = ceiling.publish(&window).await?;
            Ok::<_, anyhow::Error>(Rate::new(n, start.elapsed().as_secs_f64()))
        }
        .await;
        ceiling.close().await;
        let purged = self.purge_backlog().await;
        let rate = timed?;
        check_backlog(purged?, n)?;
        Ok(rate)
    }

    /// Empties the queue nobody consumes; returns how many messages it held.
    async fn purge_backlog(&self) -> anyhow::Result<u64> {
        match &self.broker {
            super::Broker::Amqp(b) => Ok(b.purge_backlog().await?.into()),
            super::Broker::Kafka(_) => Ok(0),
        }
    }

    /// The bridge draining `--messages` due now, to the consumed queue or (with `backlog`)
    /// to the queue nobody consumes; done when the consumer has every message (or, for the
    /// backlog, the broker confirmed every one) and Redis is empty.
    async fn drain(&self, backlog: bool) -> anyhow::Result<Forward> {
        let n = self.args.messages;
        let what = if backlog { "backlog" } else { "forward" };
        eprintln!("bench: {what}, {n} messages");
        let staged = self.stage(what, n).await?;
        let (key, mut conn) = (staged.key.clone(), self.conn.clone());
        let (bridge, _) = self
            .start_bridge_to(what, std::slice::from_ref(&key), true, backlog)
            .await?;
        self.tally.reset(staged.base, n);
        let cpu_before = bridge.cpu_seconds()?;
        let start = Instant::now();
        self.release(&staged).await?;
        // The backlog is done once Redis is empty: every message confirmed, none consumed.
        let expected = if backlog { 0 } else { n };
        self.wait_drained(
            &conn,
            std::slice::from_ref(&key),
            expected,
            &bridge,
            start + budget(n),
        )
        .await?;
        let secs = start.elapsed().as_secs_f64();
        let cpu = bridge.cpu_seconds()? - cpu_before;
        let memory = bridge.memory()?;
        bridge.stop(STOP_TIMEOUT).await?;
        if backlog {
            // Every message must be in the queue: none dead-lettered or dropped on the way.
            let dead: u64 = redis::cmd("ZCARD")
                .arg(&QueueKeys::derive(&key)?.dead)
                .query_async(&mut conn)
                .await?;
            let purged = self.purge_backlog().await?;
            redis_ops::unlink_queue(&mut conn, &key).await?;
            anyhow::ensure!(dead == 0, "{dead} messages were dead-lettered");
            check_backlog(purged, n)?;
        } else {
            redis_ops::unlink_queue(&mut conn, &key).await?;
        }
        Ok(Forward {
            rate: Rate::new(n, secs),
            cpu_seconds: cpu,
            cpu_seconds_per_100k: cpu * 100_000.0 / n as f64,
            peak_rss_bytes: memory.peak_bytes,
            // Nobody reads the backlog queue: no consumer to count copies.
            duplicates: if backlog {
                0
            } else {
                self.tally.summary(|_| false).duplicates
            },
        })
    }

    /// A new queue for `what` with `n` members due a second ago, all but the last loaded
    /// beside it and renamed into it by [`Self::release`] once the bridge is ready, so that
    /// neither loading nor start-up is timed.
    async fn stage(&self, what: &str, n: u64) -> anyhow::Result<Staged> {
        let key = self.new_key(what);
        let staged = Staged {
            staging: format!("{key}:staging"),
            key,
            base: self.next_base(),
            n,
            due: now_ms() - 1000,
        };
        let mut conn = self.conn.clone();
        let shape = self.args.shape();
        let Staged {
            key,
            staging,
            base,
            due,
            ..
        } = &staged;
        redis_ops::load(&mut conn, &shape, key, staging, *base, n - 1, |_| *due).await?;
        Ok(staged)
    }

    /// Renames the staged members into the queue, then schedules the last one, whose `ZADD`
    /// wakes the idle workers (a rename is a generic keyspace event).
    async fn release(&self, s: &Staged) -> anyhow::Result<()> {
        let mut conn = self.conn.clone();
        if s.n > 1 {
            redis::cmd("RENAME")
                .arg(&s.staging)
                .arg(&s.key)
                .query_async::<()>(&mut conn)
                .await?;
        }
        let mut last = redis::pipe();
        self.args.shape().schedule(
            &mut last,
            &QueueKeys::derive(&s.key)?,
            &s.key,
            s.base + s.n - 1,
            s.due,
        );
        last.query_async::<()>(&mut conn).await?;
        Ok(())
    }

    /// Drains `--crash-messages` due at once with the bench trigger's settings, SIGKILLing the
    /// bridge `--kills` times mid-drain and starting it again at once; the members a killed
    /// bridge held come back when their lease expires. Counts what arrived twice.
    async fn crash(&self) -> anyhow::Result<Crash> {
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
        let end = Instant::now() + self.trigger.lease + budget(n);
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
            claimed_at_most: (self.trigger.workers
                * delay_bridge::worker::MAX_IN_FLIGHT
                * self.trigger.batch) as u64,
            seconds,
        })
    }

    async fn lateness(&self, notifications: bool) -> anyhow::Result<Lateness> {
        let mut conn = self.conn.clone();
        let flags = if notifications {
            delay_bridge::redis_checks::with_needed_flags(&self.original_flags)
        } else {
            // Without the keyspace channel the bridge has no notifications, whatever else is set.
            self.original_flags.replace('K', "")
        };
        if flags != self.original_flags {
            redis_ops::set_notify_flags(&mut conn, &flags).await?;
        }
        let result = self.steady_load(notifications).await;
        if flags != self.original_flags {
            redis_ops::set_notify_flags(&mut conn, &self.original_flags).await?;
        }
        result
    }

    async fn steady_load(&self, notifications: bool) -> anyhow::Result<Lateness> {
        let (rate, duration) = (self.args.rate, self.args.duration);
        eprintln!(
            "bench: steady load, {rate} msg/s for {duration:?}, notifications {}",
            if notifications { "on" } else { "off" }
        );
        let key = self.new_key(if notifications {
            "steady"
        } else {
            "steady-off"
        });
        let (bridge, config) = self
            .start_bridge("steady", std::slice::from_ref(&key), notifications)
            .await?;
        let guard = config.triggers[0].guard_interval;
        let capacity = (rate as f64 * duration.as_secs_f64()).ceil() as u64 + rate;
        let base = self.next_base();
        self.tally.reset(base, capacity);
        let cpu_before = bridge.cpu_seconds()?;
        let mut conn = self.conn.clone();
        let mut rng = rand::rngs::StdRng::from_entropy();
        let mut tick = tokio::time::interval(Duration::from_millis(2));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let start = Instant::now();
        let mut sent = 0u64;
        let mut early = vec![false; capacity as usize];
        let shape = self.args.shape();
        let queue = QueueKeys::derive(&key)?;
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
                shape.schedule(&mut pipe, &queue, &key, base + seq, now + ahead);
            }
            pipe.query_async::<()>(&mut conn).await?;
            sent = target;
        }
        self.wait_received(sent, Duration::from_secs(35))
            .await
            .with_context(|| bridge.log_tail())?;
        let cpu = bridge.cpu_seconds()? - cpu_before;
        let confirm_p99 = bridge.metrics().await.and_then(|m| {
            histogram_bound(&m, "delay_bridge_lateness_seconds", 0.99).map(|s| s * 1000.0)
        });
        bridge.stop(STOP_TIMEOUT).await?;
        redis_ops::unlink_queue(&mut conn, &key).await?;
        let s = self.tally.summary(|_| true);
        let ms = |q: f64| quantile(&s.late_us, q).unwrap_or(0) as f64 / 1000.0;
        let e = self.tally.summary(|i| early[i as usize]);
        Ok(Lateness {
            notifications,
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
        })
    }

    async fn idle(&self) -> anyhow::Result<Idle> {
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

    async fn big_rss(&self) -> anyhow::Result<Rss> {
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
