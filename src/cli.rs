//! The command line: `run`, `check`, `stats`, `enqueue`, `dead-letter` and `consume`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::config::{self, Config, ConfigError, LogFormat, SinkConfig};
use crate::keys::QueueKeys;
use crate::secret::redact_url;
use crate::store::Store;

/// `println!` that ignores a closed stdout (`delay-bridge stats | head`) instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Exit code for a bad configuration (EX_CONFIG).
pub const EXIT_CONFIG: i32 = 78;

/// delay-bridge: Redis sorted sets in, RabbitMQ / Kafka messages out, on time.
#[derive(Debug, Parser)]
#[command(name = "delay-bridge", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Run(ConfigArg),
    /// Validate a config and print the resolved triggers (secrets redacted).
    Check(ConfigArg),
    /// Print the backlog of every trigger.
    Stats {
        #[command(flatten)]
        config: ConfigArg,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Schedule a message the way a producer would (`ZADD key due member`).
    Enqueue {
        #[command(flatten)]
        config: ConfigArg,
        /// Trigger whose key to write to.
        #[arg(long, short)]
        trigger: String,
        /// Delay from now, e.g. `5s` or `250ms` (default: due now).
        #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "at")]
        delay: Option<Duration>,
        /// Absolute due time in epoch milliseconds.
        #[arg(long)]
        at: Option<i64>,
        /// The payload (the member).
        payload: String,
    },
    /// Inspect and replay dead letters.
    #[command(subcommand)]
    DeadLetter(DeadLetter),
    /// Measure forwarding rate, lateness and idle cost against the local Redis and a broker.
    Bench(crate::bench::BenchArgs),
    /// Print messages arriving on a RabbitMQ queue with their lateness (for trying the bridge out).
    Consume {
        /// AMQP URL.
        #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
        url: String,
        /// Queue to consume from.
        #[arg(long)]
        queue: String,
        /// Stop after this many messages.
        #[arg(long)]
        count: Option<u64>,
        /// Stop after this long without a message.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
        idle: Duration,
    },
}

/// `dead-letter` subcommands.
#[derive(Debug, Subcommand)]
pub enum DeadLetter {
    /// List dead letters, oldest first, with their reason.
    List {
        #[command(flatten)]
        config: ConfigArg,
        /// Trigger to look at.
        #[arg(long, short)]
        trigger: String,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Move dead letters back to the queue, due now.
    Requeue {
        #[command(flatten)]
        config: ConfigArg,
        /// Trigger to requeue for.
        #[arg(long, short)]
        trigger: String,
        /// Members to requeue (default: the oldest `--limit`).
        #[arg(long = "member")]
        members: Vec<String>,
        /// At most this many when no member is named.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
}

/// `--config FILE`.
#[derive(Debug, Args)]
pub struct ConfigArg {
    /// Path of the TOML configuration.
    #[arg(
        long,
        short,
        env = "DELAY_BRIDGE_CONFIG",
        default_value = "config/example.toml"
    )]
    pub config: PathBuf,
}

/// Loads the config or prints every problem and returns the EX_CONFIG exit code.
pub fn load_or_exit(path: &std::path::Path) -> Result<Config, i32> {
    config::load(path).map_err(|e: ConfigError| {
        eprintln!("error: {}: {e}", path.display());
        EXIT_CONFIG
    })
}

/// Sets up tracing to stderr: `RUST_LOG` wins over `[log] level`.
pub fn init_tracing(format: LogFormat, level: &str) {
    use tracing_subscriber::EnvFilter;
    let mut filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // lapin logs returned messages with their bodies and channel closes as errors; the
    // bridge reports those itself, without payloads, so lapin stays quiet unless asked.
    let asked = std::env::var("RUST_LOG").unwrap_or_else(|_| level.to_string());
    if !asked.contains("lapin") {
        if let Ok(d) = "lapin=off".parse() {
            filter = filter.add_directive(d);
        }
    }
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

/// Runs a parsed command line; returns the process exit code.
pub async fn dispatch(cli: Cli) -> i32 {
    let result = match cli.command {
        Command::Run(c) => return run(&c.config).await,
        Command::Check(c) => return check(&c.config),
        Command::Stats { config, json } => with_config(&config.config, |c| stats(c, json)).await,
        Command::Enqueue {
            config,
            trigger,
            delay,
            at,
            payload,
        } => with_config(&config.config, |c| enqueue(c, trigger, delay, at, payload)).await,
        Command::DeadLetter(DeadLetter::List {
            config,
            trigger,
            limit,
        }) => with_config(&config.config, |c| dead_list(c, trigger, limit)).await,
        Command::DeadLetter(DeadLetter::Requeue {
            config,
            trigger,
            members,
            limit,
        }) => with_config(&config.config, |c| dead_requeue(c, trigger, members, limit)).await,
        Command::Bench(args) => crate::bench::run(args).await,
        Command::Consume {
            url,
            queue,
            count,
            idle,
        } => consume(url, queue, count, idle).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

async fn with_config<F, Fut>(path: &std::path::Path, f: F) -> anyhow::Result<i32>
where
    F: FnOnce(Config) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<i32>>,
{
    match load_or_exit(path) {
        Ok(c) => f(c).await,
        Err(code) => Ok(code),
    }
}

async fn run(path: &std::path::Path) -> i32 {
    let config = match load_or_exit(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    init_tracing(config.log.format, &config.log.level);
    let shutdown = crate::bridge::Shutdown::default();
    let stop = shutdown.stop.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received; send another to exit at once");
        stop.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal: exiting now; unconfirmed leases will be recovered");
        std::process::exit(130);
    });
    match crate::bridge::run(config, crate::metrics::Metrics::new(), shutdown).await {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "delay-bridge failed");
            eprintln!("error: {e:#}");
            1
        }
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn check(path: &std::path::Path) -> i32 {
    let config = match load_or_exit(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    say!("config {} is valid", path.display());
    say!("redis: {}", redact_url(&config.redis.url));
    say!("metrics: http://{}/metrics", config.metrics.listen);
    for (name, sink) in &config.sinks {
        match sink {
            SinkConfig::Amqp(a) => say!("sink {name}: amqp {}", redact_url(&a.url)),
            SinkConfig::Kafka(k) => {
                let props: Vec<String> = k
                    .properties
                    .iter()
                    .map(|(key, v)| {
                        let secret = ["password", "secret", "key.pem", "token"]
                            .iter()
                            .any(|s| key.contains(s));
                        format!("{key}={}", if secret { "***" } else { v.as_str() })
                    })
                    .collect();
                say!("sink {name}: kafka {} [{}]", k.brokers, props.join(", "));
            }
        }
    }
    for t in &config.triggers {
        let keys = QueueKeys::derive(&t.key).expect("validated");
        let dest = match &config.sinks[&t.sink] {
            SinkConfig::Amqp(_) => format!(
                "exchange={:?} routing_key={:?}",
                t.exchange.clone().unwrap_or_default(),
                t.routing_key.clone().unwrap_or_default()
            ),
            SinkConfig::Kafka(_) => format!(
                "topic={:?} kafka_key={}",
                t.topic.clone().unwrap_or_default(),
                match t.kafka_key.unwrap_or_default() {
                    crate::config::KafkaKey::None => "none",
                    crate::config::KafkaKey::Member => "member",
                }
            ),
        };
        say!(
            "trigger {}: key={} inflight={} dead={} -> sink {} {dest} workers={} batch={} lease={} guard_interval={} \
             publish_timeout={} max_attempts={} backoff={}..{} max_message_bytes={}",
            t.name,
            keys.source,
            keys.inflight,
            keys.dead,
            t.sink,
            t.workers,
            t.batch,
            humantime::format_duration(t.lease),
            humantime::format_duration(t.guard_interval),
            humantime::format_duration(t.publish_timeout),
            t.max_attempts,
            humantime::format_duration(t.backoff_initial),
            humantime::format_duration(t.backoff_max),
            t.max_message_bytes,
        );
    }
    0
}

async fn connect(config: &Config) -> anyhow::Result<redis::aio::ConnectionManager> {
    let client = crate::bridge::redis_client(config)?;
    crate::bridge::connect_redis(config, &client)
        .await
        .with_context(|| format!("connecting to {}", redact_url(&config.redis.url)))
}

fn store_for(
    config: &Config,
    conn: redis::aio::ConnectionManager,
    trigger: &str,
) -> anyhow::Result<Store> {
    let t = config
        .triggers
        .iter()
        .find(|t| t.name == trigger)
        .with_context(|| format!("no trigger named `{trigger}`"))?;
    Ok(Store::new(conn, QueueKeys::derive(&t.key)?))
}

async fn stats(config: Config, json: bool) -> anyhow::Result<i32> {
    let conn = connect(&config).await?;
    let mut rows = Vec::new();
    for t in &config.triggers {
        let s = store_for(&config, conn.clone(), &t.name)?.stats().await?;
        rows.push((t.name.clone(), s));
    }
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|(name, s)| serde_json::json!({"trigger": name, "stats": s}))
            .collect();
        say!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        say!(
            "{:<24} {:>12} {:>10} {:>10} {:>10} {:>16}",
            "TRIGGER",
            "SCHEDULED",
            "DUE",
            "INFLIGHT",
            "DEAD",
            "OLDEST_DUE_AGE"
        );
        for (name, s) in rows {
            say!(
                "{:<24} {:>12} {:>10} {:>10} {:>10} {:>15.3}s",
                name,
                s.scheduled,
                s.due,
                s.inflight,
                s.dead,
                s.oldest_due_age_seconds
            );
        }
    }
    Ok(0)
}

async fn enqueue(
    config: Config,
    trigger: String,
    delay: Option<Duration>,
    at: Option<i64>,
    payload: String,
) -> anyhow::Result<i32> {
    let mut conn = connect(&config).await?;
    let store = store_for(&config, conn.clone(), &trigger)?;
    let due = match at {
        Some(at) => at,
        None => {
            let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
            secs * 1000 + micros / 1000 + delay.unwrap_or_default().as_millis() as i64
        }
    };
    let _: i64 = redis::cmd("ZADD")
        .arg(&store.keys().source)
        .arg(due)
        .arg(payload.as_bytes())
        .query_async(&mut conn)
        .await?;
    say!("scheduled on {} due at {due}", store.keys().source);
    Ok(0)
}

async fn dead_list(config: Config, trigger: String, limit: usize) -> anyhow::Result<i32> {
    let conn = connect(&config).await?;
    let store = store_for(&config, conn, &trigger)?;
    for (member, at, reason) in store.list_dead(limit).await? {
        say!(
            "{at}\t{}\t{}",
            reason.unwrap_or_else(|| "{}".into()),
            String::from_utf8_lossy(&member)
        );
    }
    Ok(0)
}

async fn dead_requeue(
    config: Config,
    trigger: String,
    members: Vec<String>,
    limit: usize,
) -> anyhow::Result<i32> {
    let conn = connect(&config).await?;
    let store = store_for(&config, conn, &trigger)?;
    let members: Vec<Vec<u8>> = members.into_iter().map(String::into_bytes).collect();
    let n = store.requeue_dead(&members, limit.max(1)).await?;
    say!("requeued {n} dead letter(s) on {}", store.keys().source);
    Ok(0)
}

async fn consume(
    url: String,
    queue: String,
    count: Option<u64>,
    idle: Duration,
) -> anyhow::Result<i32> {
    use futures_util::StreamExt;
    use lapin::options::{BasicAckOptions, BasicConsumeOptions};
    let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .with_context(|| format!("connecting to {}", redact_url(&url)))?;
    let channel = conn.create_channel().await?;
    let mut consumer = channel
        .basic_consume(
            &queue,
            "delay-bridge-consume",
            BasicConsumeOptions::default(),
            Default::default(),
        )
        .await?;
    let mut seen = 0u64;
    while count.is_none_or(|c| seen < c) {
        let Ok(Some(delivery)) = tokio::time::timeout(idle, consumer.next()).await else {
            break;
        };
        let delivery = delivery?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as i64;
        let due = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-delay-due-ms").cloned())
            .and_then(|v| match v {
                lapin::types::AMQPValue::LongLongInt(n) => Some(n),
                _ => None,
            });
        let late = due.map_or_else(|| "?".to_string(), |d| format!("{}ms", now - d));
        say!("late={late}\t{}", String::from_utf8_lossy(&delivery.data));
        delivery.ack(BasicAckOptions::default()).await?;
        seen += 1;
    }
    Ok(0)
}
