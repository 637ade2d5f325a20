//! The bench phases: ceilings, forwarding a backlog, lateness under steady load, idle cost, memory.

use std::time::Duration;

use anyhow::{bail, Context};
use delay_bridge::keys::QueueKeys;
use delay_bridge::parts::config::Config;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::ceiling::{Ceiling, Window};
use super::process::{free_port, histogram_bound, metric_sum, BridgeProcess};
use super::redis_ops::{self, CommandCounter};
use super::report::{
    Crash, Forward, Idle, Lateness, Machine, PhaseError, ProcessCpu, Rate, Report, Rss, Settings,
    Wakes,
};
use super::tally::quantile;
use super::{Bench, BridgeToml, Phase};

mod ceilings;
mod cost;
mod herd;
mod instructions;
mod load;
mod rabbit;
mod scheduled;

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
        report.machine = self.machine().await;
        report.settings = self.settings();
        let mut errors = Errors::default();
        self.throughput_phases(report, &mut errors).await;
        self.load_phases(report, &mut errors).await;
        report.errors = errors.0;
    }

    /// Whether phase `p` runs (not in `--skip`).
    fn runs(&self, p: Phase) -> bool {
        !self.args.skip.contains(&p)
    }

    /// The ceilings, forwarding, Kafka's cost and the backlog.
    async fn throughput_phases(&self, report: &mut Report, errors: &mut Errors) {
        let amqp = matches!(self.broker, super::Broker::Amqp(_));
        if self.runs(Phase::Broker) && amqp {
            let (c, failed) = self.amqp_ceilings(false, &mut report.notes).await;
            report.broker_ceiling = c.amqprs.as_ref().map(|r| r.rate.clone());
            report.amqp_ceilings = Some(c);
            failed.into_iter().for_each(|e| errors.fail("broker", e));
        } else if self.runs(Phase::Broker) {
            report.broker_ceiling = errors.keep("broker", self.broker_ceiling().await);
        }
        if self.runs(Phase::Redis) {
            report.redis_ceiling = errors.keep("redis", self.redis_ceiling().await);
        }
        if !self.args.redis_cluster.is_empty() {
            report.cluster = errors.keep("cluster", self.cluster().await);
        }
        if self.runs(Phase::Forward) {
            report.forward = errors.keep("forward", self.drain(false).await);
        }
        if let Some(f) = &report.forward {
            if self.runs(Phase::Cost) {
                report.cost = errors.keep("cost", self.cost(f).await);
            }
        }
        if self.runs(Phase::Instructions) {
            report.instructions = errors
                .keep("instructions", self.instructions(&mut report.notes).await)
                .flatten();
        }
        if self.runs(Phase::Backlog) && self.backlog_destination.is_some() {
            let (c, failed) = self.amqp_ceilings(true, &mut report.notes).await;
            report.backlog_ceiling = c.amqprs.as_ref().map(|r| r.rate.clone());
            report.amqp_backlog_ceilings = Some(c);
            failed
                .into_iter()
                .for_each(|e| errors.fail("backlog ceiling", e));
            report.backlog = errors.keep("backlog", self.drain(true).await);
        }
    }

    /// The steady load, the schedule, the herd, idle, crash, ingress and memory.
    async fn load_phases(&self, report: &mut Report, errors: &mut Errors) {
        if self.runs(Phase::Lateness) {
            let modes: &[bool] = if self.args.no_notify {
                &[true, false]
            } else {
                &[true]
            };
            for &on in modes {
                let phase = if on { "lateness" } else { "lateness-no-notify" };
                for &rate in &self.args.rate {
                    let run = errors.keep(phase, self.lateness(on, rate).await);
                    report.lateness.extend(run);
                }
            }
        }
        if let Some(n) = self.args.scheduled {
            report.scheduled = errors.keep("scheduled", self.scheduled(n).await);
        }
        if self.runs(Phase::Herd) {
            report.herd = errors.keep("herd", self.herd().await);
        }
        if self.runs(Phase::Idle) {
            report.idle = errors.keep("idle", self.idle().await);
        }
        if self.runs(Phase::Crash) {
            report.crash = errors.keep("crash", self.crash().await);
        }
        if self.runs(Phase::Ingress) {
            report.ingress = errors.keep("ingress", self.ingress().await).flatten();
        }
        if self.args.big {
            report.rss = errors.keep("rss", self.big_rss().await);
        }
    }

    /// The machine the run is on: cores, CPU model, Redis version.
    async fn machine(&self) -> Machine {
        let mut conn = self.conn.clone();
        Machine {
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
        }
    }

    /// What the run was asked to do.
    fn settings(&self) -> Settings {
        Settings {
            sink: format!("{:?}", self.args.sink).to_lowercase(),
            messages: self.args.messages,
            payload_bytes: self.args.payload_bytes,
            shape: self.args.shape().label(),
            workers: self.trigger.workers(),
            batch: self.trigger.batch(),
            rates: self.args.rate.clone(),
            ceiling_channels: self.args.ceiling_channels,
            ceiling_window: self.args.ceiling_window,
            duration_s: self.args.duration.as_secs_f64(),
        }
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
        let (path, config, port) = self.bridge_toml(name, keys, notifications, backlog)?;
        let log = self.dir.join(format!("{name}.log"));
        let mut bridge = BridgeProcess::spawn(&self.bridge, &path, port, &log)?;
        let took = bridge.wait_ready(READY_TIMEOUT).await?;
        Ok((bridge, config, took))
    }

    /// [`Self::start_bridge`] under `wrapper` (a profiler's command line), allowed `ready`
    /// to get ready.
    async fn start_bridge_under(
        &self,
        wrapper: &[String],
        ready: Duration,
        name: &str,
        keys: &[String],
    ) -> anyhow::Result<(BridgeProcess, Config)> {
        let (path, config, port) = self.bridge_toml(name, keys, true, false)?;
        let log = self.dir.join(format!("{name}.log"));
        let mut bridge = BridgeProcess::spawn_under(wrapper, &self.bridge, &path, port, &log)?;
        bridge.wait_ready(ready).await?;
        Ok((bridge, config))
    }

    /// Writes the config of a bridge with one trigger per key; returns its path, the config
    /// and the metrics port.
    fn bridge_toml(
        &self,
        name: &str,
        keys: &[String],
        notifications: bool,
        backlog: bool,
    ) -> anyhow::Result<(std::path::PathBuf, Config, u16)> {
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
        Ok((path, config, port))
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

    /// CPU seconds so far of the Redis server and of the broker's process on this machine.
    async fn other_cpu(&self, conn: &mut redis::aio::MultiplexedConnection) -> OtherCpu {
        let redis = redis_ops::server_cpu_seconds(conn).await.ok().flatten();
        let broker = self.broker.process_name().and_then(|name| {
            let pid = crate::process::find_process(name)?;
            let seconds = crate::process::process_cpu_seconds(pid).ok()?;
            Some(BrokerCpu { name, pid, seconds })
        });
        OtherCpu { redis, broker }
    }

    /// Empties the queue nobody consumes; returns how many messages it held.
    async fn purge_backlog(&self) -> anyhow::Result<u64> {
        match &self.broker {
            super::Broker::Amqp(b) => Ok(b.purge_backlog().await?.into()),
            super::Broker::Kafka(_) | super::Broker::Http(_) => Ok(0),
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
        let others = self.other_cpu(&mut conn).await;
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
        let per_100k = |seconds: f64| seconds * 100_000.0 / n as f64;
        let (redis_cpu_per_100k, broker_cpu_per_100k) =
            others.until(&self.other_cpu(&mut conn).await, per_100k);
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
            cpu_seconds_per_100k: per_100k(cpu),
            redis_cpu_per_100k,
            broker_cpu_per_100k,
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
}

/// The phases that failed, each logged as it fails.
#[derive(Default)]
struct Errors(Vec<PhaseError>);

impl Errors {
    fn fail(&mut self, phase: &str, e: anyhow::Error) {
        eprintln!("bench: {phase} failed: {e:#}");
        self.0.push(PhaseError {
            phase: phase.into(),
            error: format!("{e:#}"),
        });
    }

    /// What `phase` measured, or `None` with its failure recorded.
    fn keep<T>(&mut self, phase: &str, result: anyhow::Result<T>) -> Option<T> {
        result.map_err(|e| self.fail(phase, e)).ok()
    }
}

/// The Redis server's and the broker process's CPU seconds at one moment.
struct OtherCpu {
    redis: Option<f64>,
    broker: Option<BrokerCpu>,
}

/// The broker's process (named, with its pid, so that a restart between two readings is not
/// taken for CPU) and its CPU seconds.
struct BrokerCpu {
    name: &'static str,
    pid: u32,
    seconds: f64,
}

impl OtherCpu {
    /// What each used from this reading to `later`, through `per_100k`.
    fn until(
        &self,
        later: &OtherCpu,
        per_100k: impl Fn(f64) -> f64,
    ) -> (Option<f64>, Option<ProcessCpu>) {
        let redis = self.redis.zip(later.redis).map(|(a, b)| per_100k(b - a));
        let broker = self.broker.as_ref().zip(later.broker.as_ref());
        let broker = broker
            .filter(|(a, b)| a.pid == b.pid)
            .map(|(a, b)| ProcessCpu {
                process: a.name.to_string(),
                seconds_per_100k: per_100k(b.seconds - a.seconds),
            });
        (redis, broker)
    }
}
